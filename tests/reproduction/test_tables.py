"""Writing a table as CSV, Markdown and LaTeX."""

from __future__ import annotations

import pandas as pd
import pytest

from poetlab.errors import InvalidArgumentError
from poetlab.reproduction.tables import write_table


def test_write_table_latex(tmp_path):
    paths = write_table(pd.DataFrame({"model": ["a_b"], "x": [1.5]}), tmp_path / "t", ("csv", "md", "tex"))
    assert [p.suffix for p in paths] == [".csv", ".md", ".tex"]
    tex = paths[2].read_text()
    assert "\\begin{tabular}" in tex and "a\\_b" in tex
    with pytest.raises(InvalidArgumentError, match="unknown table format"):
        write_table(pd.DataFrame({"a": [1]}), tmp_path / "t", ("xls",))

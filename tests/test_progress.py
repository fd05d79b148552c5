"""Progress bars: on for a person at a terminal, off where the pipeline's environment says so."""

from __future__ import annotations

import io

from poetlab.progress import PROGRESS_ENV, progress_bar, progress_enabled


def test_progress_bars_are_off_where_the_pipeline_says_so(monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "1")
    assert progress_enabled() and not progress_bar(range(3), disable=False, file=io.StringIO()).disable
    for off in ("0", "off", "False"):
        monkeypatch.setenv(PROGRESS_ENV, off)
        assert not progress_enabled() and progress_bar(range(3), disable=False).disable
        assert list(progress_bar(range(3))) == [0, 1, 2]  # still iterates

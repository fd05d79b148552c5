"""Table 3 (POET against POFO): what changes between the two, on small tidy inputs."""

from __future__ import annotations

import pandas as pd
import pytest

from poetlab.reproduction.table3_pofo import pofo_metrics, pofo_table

from comparison_rows import row, rows


def test_pofo_table_changes():
    data = rows(row("poet", 0.5, 1.0, peak=90, runtime=1.0), row("pofo", 0.5, 1.1, peak=100, runtime=1.25, overlapped=0.8),
                row("poet", 0.0, 1.2, peak=50), row("pofo", 0.0, feasible=False))
    table = pofo_table(data)
    first = table.iloc[0]
    assert first.poet_peak_change == pytest.approx(-0.1) and first.poet_throughput_change == pytest.approx(0.25)
    assert first.poet_overlapped_throughput_change == pytest.approx(-0.2)  # POFO faster once its transfers overlap
    assert pd.isna(table.iloc[1].poet_peak_change)
    metrics = pofo_metrics(table)
    assert metrics["n_both_feasible"] == 1 and metrics["n_pofo_infeasible"] == 1
    assert metrics["mean_poet_peak_change"] == pytest.approx(-0.1)

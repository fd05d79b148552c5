"""Fig. 3 (the memory/energy frontier): its summary, conclusion and figure on small tidy inputs."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from poetlab.reproduction.fig3_frontier import frontier_conclusion, frontier_figure, frontier_summary

from comparison_rows import row, rows


def test_frontier_summary_and_figure():
    data = rows(
        row(fraction=1.0, energy=1.0, peak=100), row(fraction=0.5, energy=1.01, peak=70), row(fraction=0.0, energy=1.05, peak=50),
        row(fraction=1.0, energy=2.0, plain=2.0, peak=10, platform="q"), row(fraction=0.0, platform="q", feasible=False),
    )
    summary = frontier_summary(data).set_index("platform")
    assert summary.loc["p", "memory_reduction"] == pytest.approx(2.0)
    assert summary.loc["p", "energy_overhead_at_min_peak"] == pytest.approx(0.05)
    assert summary.loc["q", "n_feasible"] == 1 and summary.loc["q", "n_budgets"] == 2
    fig = frontier_figure(data, {"p": 80, "q": None})
    assert len(fig.axes) == 2 and [ax.get_title() for ax in fig.axes] == ["p", "q"]
    plt.close(fig)
    # the closing text, from the rows: budgets met, overheads, who fits in the device's RAM
    more = pd.concat([data, rows(row(fraction=0.0, energy=1.2, peak=30, model="small", status="time_limit", gap=0.03))], ignore_index=True)
    text = frontier_conclusion(more, {"p": 40, "q": None})
    assert text.startswith("POET has a schedule at 5 of 6 budgets") and "p 20%; q 0%" in text
    assert "1 solves stopped at the time limit" in text and "3%, is small on p at fraction 0" in text
    assert "On p (40 bytes of RAM) small (30 bytes) fits; the other models' smallest peaks are 1.25x to 1.25x its RAM." in text
    assert "On q" not in text  # its RAM is not known

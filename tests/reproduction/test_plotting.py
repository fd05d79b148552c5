"""What every figure shares: time-limited points ringed."""

from __future__ import annotations

import matplotlib.pyplot as plt

from poetlab.reproduction.fig3_frontier import frontier_figure
from poetlab.reproduction.fig4_runtime import runtime_figure
from poetlab.reproduction.fig5_capuchin import capuchin_figure

from comparison_rows import row, rows


def test_time_limited_points_are_ringed():
    from poetlab.reproduction.plotting import TIME_LIMITED_LABEL

    def ringed(fig) -> int:
        n = sum(len(c.get_offsets()) for ax in fig.axes for c in ax.collections if c.get_label() == TIME_LIMITED_LABEL)
        plt.close(fig)
        return n

    frontier = rows(row(fraction=1.0, peak=100), row(fraction=0.5, energy=1.01, peak=70, status="time_limit", gap=0.02), row(fraction=0.0, energy=1.05, peak=50))
    assert ringed(frontier_figure(frontier)) == 1
    assert ringed(frontier_figure(frontier.assign(status="optimal"))) == 0
    runtime = rows(row("poet", 0.2, 1.0, factor=1.0, status="time_limit"), row("checkmate", 0.2, 1.1, factor=1.0), row("paging_only", 0.2, 1.05, factor=1.0))
    assert ringed(runtime_figure(runtime)) == 1
    capuchin = rows(row("poet", 1.0), row("capuchin", 1.0), row("poet", 0.5, 1.001, status="time_limit"), row("capuchin", 0.5, 1.8))
    assert ringed(capuchin_figure(capuchin)) == 1

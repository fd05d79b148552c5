"""Fig. 5 (POET against Capuchin): table, metrics and figure on small tidy inputs."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from poetlab.reproduction.fig5_capuchin import capuchin_figure, capuchin_metrics, capuchin_table

from comparison_rows import row, rows


def test_capuchin_table_metrics_and_figure():
    data = rows(
        row("poet", 1.0, 1.0), row("capuchin", 1.0, 1.0),
        row("poet", 0.5, 1.001), row("capuchin", 0.5, 1.8),
        row("poet", 0.0, 1.004, gap=0.001), row("capuchin", 0.0, feasible=False),
    )
    table = capuchin_table(data)
    assert table.budget_fraction.tolist() == [1.0, 0.5, 0.0]
    assert table.capuchin_overhead.iloc[1] == pytest.approx(0.8) and pd.isna(table.capuchin_overhead.iloc[2])
    assert table.poet_mip_gap.tolist() == [0.0, 0.0, 0.001]
    metrics = capuchin_metrics(data)["platforms"]["p"]
    assert metrics["poet"]["max_overhead"] == pytest.approx(0.004) and metrics["capuchin"]["n_feasible"] == 1
    fig = capuchin_figure(data)
    assert fig.axes[0].xaxis_inverted()  # tighter budgets to the right
    plt.close(fig)
    two = pd.concat([data, data.assign(platform="q")], ignore_index=True)
    assert capuchin_table(two).platform.tolist() == ["p"] * 3 + ["q"] * 3
    fig = capuchin_figure(two)
    assert [ax.get_title() for ax in fig.axes] == ["m on p", "m on q"]  # one panel per platform
    plt.close(fig)
    # POET solved without Capuchin's start: its own columns, gap, metrics and legend entry
    cold = pd.concat([data, rows(row("poet_no_capuchin", 1.0, 1.0), row("poet_no_capuchin", 0.5, 1.3, gap=0.01),
                                 row("poet_no_capuchin", 0.0, 1.004))], ignore_index=True)
    table = capuchin_table(cold)
    assert [c for c in table.columns if c.endswith("_overhead")] == ["poet_overhead", "poet_no_capuchin_overhead", "capuchin_overhead"]
    assert table.poet_no_capuchin_overhead.iloc[1] == pytest.approx(0.3) and table.poet_no_capuchin_mip_gap.tolist() == [0.0, 0.01, 0.0]
    assert capuchin_metrics(cold)["platforms"]["p"]["poet_no_capuchin"]["max_overhead"] == pytest.approx(0.3)
    fig = capuchin_figure(cold)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()][-3:] == ["POET", "POET, no Capuchin start", "Capuchin"]
    plt.close(fig)

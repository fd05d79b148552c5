"""Fig. 4 (POET against the one-lever methods under runtime budgets): the comparison, its flags and the
window of runtime factors."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from poetlab.reproduction.config import SweepConfig
from poetlab.reproduction.fig4_runtime import runtime_comparison, runtime_figure

from comparison_rows import row, rows


def test_runtime_comparison_flags_poet_above_a_one_lever_method():
    data = rows(
        row("poet", 0.2, 1.10, factor=1.0), row("checkmate", 0.2, feasible=False, factor=1.0), row("paging_only", 0.2, 1.10, factor=1.0),
        row("poet", 0.2, 1.05, factor=2.0, gap=0.01), row("checkmate", 0.2, 1.06, factor=2.0), row("paging_only", 0.2, 1.10, factor=2.0),
        row("poet", 0.2, 1.20, factor=3.0, gap=0.01), row("checkmate", 0.2, 1.06, factor=3.0), row("paging_only", 0.2, 1.10, factor=3.0),
    )
    table = runtime_comparison(data)
    assert table.poet_at_or_below_both.tolist() == [True, True, False]
    assert table.poet_saving_vs_best_other.iloc[1] == pytest.approx(1 - 1.05 / 1.06)
    fig = runtime_figure(data)
    assert len(fig.axes) == 1
    plt.close(fig)


def test_window_factors():
    from poetlab.reproduction.fig4_runtime import window_factors

    config = SweepConfig(cases=(("linear", "m0"),), fractions=(0.3,), runtime_factors=(1.0, 2.0), methods=("poet",), time_limit_s=1.0,
                         threads=1, batch_size=1, remat_window_points=(0.5, 1.02))
    assert window_factors(config, 1.1) == (1.0, 1.05, 1.102, 2.0)
    assert window_factors(config, 1.0) == window_factors(config, None) == window_factors(config, float("nan")) == (1.0, 2.0)

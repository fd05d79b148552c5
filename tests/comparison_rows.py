"""Tidy comparison rows (poetlab.planners.comparison.ComparisonRow) to build small tables from, for the
reproduction tests."""

from __future__ import annotations

import pandas as pd

from poetlab.planners.comparison import ComparisonRow


def row(method="poet", fraction=1.0, energy=1.0, plain=1.0, peak=100, runtime=1.0, factor=2.0, gap=0.0, status="optimal",
        model="m", platform="p", budget=None, feasible=True, overlapped=None) -> dict:
    return dict(
        model=model, platform=platform, method=method, budget_fraction=fraction,
        ram_budget_bytes=budget if budget is not None else int(50 + 50 * fraction), runtime_budget_factor=factor,
        feasible=feasible, status=status if feasible else "infeasible", energy_j=energy if feasible else None,
        energy_overhead=energy / plain - 1 if feasible else None, runtime_s=runtime if feasible else None,
        overlapped_runtime_s=(runtime if overlapped is None else overlapped) if feasible else None,
        peak_ram_bytes=peak if feasible else None, overlapped_peak_ram_bytes=peak if feasible else None, n_recomputes=0, n_pageouts=0, mip_gap=gap, plan_time_s=0.1, reason="",
    )


def rows(*items: dict) -> pd.DataFrame:
    table = pd.DataFrame(list(items))
    assert list(table.columns) == list(ComparisonRow.__dataclass_fields__)
    return table

"""The paper's Table 3: POET against POFO (Beaumont et al. 2021), ResNet-18 on the Jetson TX2: peak memory
and throughput. The paper reports POET at 8.3% less peak memory and 13% more throughput than POFO.

POFO is planned as published (``pofo_time``: least step time, its transfers beside the computations at
the platform's bandwidth, memory held until a transfer ends), POET for least energy. Both plan at the same RAM budgets and runtime budget on the same simulator.
Throughput is training steps per second, one over a step's time, read two ways for both methods: the
simulator's (compute and paging one after the other: POET's model, the ``_steps_per_s`` columns) and
with transfers on a stream beside the computations, page-ins issued early and page-outs' memory held
until they end, within the budget (POFO's model, :mod:`poetlab.core.overlap`: the
``_overlapped_steps_per_s`` columns, with the peak that issue order reaches, ``_overlapped_peak_ram_bytes``).
The throughput claim is decided on POFO's reading, the one it plans for (:mod:`poetlab.reproduction.claims`)."""

from __future__ import annotations

import pandas as pd

PAPER_PEAK_CHANGE = -0.083
PAPER_THROUGHPUT_CHANGE = 0.13
#: POET's relative changes against POFO: change column -> the per-method column it compares
CHANGES = {
    "poet_peak_change": "peak_ram_bytes",
    "poet_throughput_change": "steps_per_s",
    "poet_overlapped_peak_change": "overlapped_peak_ram_bytes",
    "poet_overlapped_throughput_change": "overlapped_steps_per_s",
    "poet_energy_change": "energy_j",
}


def pofo_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per RAM budget: each method's peak, throughput and energy, and POET's relative change."""
    out = []
    pofo = next(m for m in dict.fromkeys(rows.method) if m != "poet")  # pofo_time (as published) or pofo (energy)
    for (fraction, budget), at in rows.groupby(["budget_fraction", "ram_budget_bytes"], sort=False):
        by = at.set_index("method").rename(index={pofo: "pofo"})
        row: dict[str, object] = {"budget_fraction": float(fraction), "ram_budget_bytes": int(budget)}
        for method in ("pofo", "poet"):
            r = by.loc[method]
            row[f"{method}_peak_ram_bytes"] = int(r.peak_ram_bytes) if r.feasible else None
            row[f"{method}_steps_per_s"] = float(1 / r.runtime_s) if r.feasible else None
            row[f"{method}_overlapped_steps_per_s"] = float(1 / r.overlapped_runtime_s) if r.feasible else None
            row[f"{method}_overlapped_peak_ram_bytes"] = int(r.overlapped_peak_ram_bytes) if r.feasible else None
            row[f"{method}_energy_j"] = float(r.energy_j) if r.feasible else None
        both = row["pofo_peak_ram_bytes"] is not None and row["poet_peak_ram_bytes"] is not None
        for change, column in CHANGES.items():
            row[change] = row[f"poet_{column}"] / row[f"pofo_{column}"] - 1 if both else None
        row["poet_status"] = by.loc["poet"].status
        row["pofo_status"] = by.loc["pofo"].status
        out.append(row)
    return pd.DataFrame(out).sort_values("budget_fraction", ascending=False, ignore_index=True)


def pofo_metrics(table: pd.DataFrame) -> dict[str, object]:
    """The mean of POET's changes over the budgets where both methods have a schedule (the paper gives
    one number per metric)."""
    both = table.dropna(subset=["poet_peak_change"])
    mean = (lambda col: None if both.empty else float(both[col].mean()))
    return {
        "n_budgets": int(len(table)),
        "n_both_feasible": int(len(both)),
        "n_pofo_infeasible": int(table.pofo_peak_ram_bytes.isna().sum()),
        "n_poet_infeasible": int(table.poet_peak_ram_bytes.isna().sum()),
        **{f"mean_{change}": mean(change) for change in CHANGES},
    }

"""Each claim of the paper beside our number, and a verdict: ``reproduced``, or ``differs: why``.

A claim is a small function over the tidy outputs of the other stages (:class:`Outputs`); a claim whose
inputs this preset did not produce says so instead of guessing. The paper's numbers are constants here,
each next to the sentence it comes from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from poetlab.reproduction.feasibility import CORTEX_M_PLATFORMS, PAPER_TRAIN_INFERENCE_RATIO
from poetlab.reproduction.fig3_frontier import frontier_summary
from poetlab.reproduction.fig4_runtime import runtime_comparison
from poetlab.reproduction.fig5_capuchin import PAPER_CAPUCHIN_OVERHEAD, PAPER_POET_OVERHEAD_BELOW, capuchin_table
from poetlab.reproduction.table3_pofo import PAPER_PEAK_CHANGE, PAPER_THROUGHPUT_CHANGE, pofo_metrics


@dataclass(frozen=True)
class Outputs:
    """The tidy outputs of the stages the claims read."""

    frontier: pd.DataFrame  # fig3 rows
    runtime: pd.DataFrame  # fig4 rows
    capuchin: pd.DataFrame  # fig5 rows
    pofo: pd.DataFrame  # table 3 (one row per budget)
    feasibility: pd.DataFrame
    memory_ratio: pd.DataFrame
    gap_tolerance: float = 0.0


@dataclass(frozen=True)
class Claim:
    """``key`` names the claim in metrics and tests; ``verdict`` is ``reproduced`` or ``differs: <why>``."""

    key: str
    claim: str
    section: str
    paper: str
    ours: str
    verdict: str


def _pct(x: float | None) -> str:
    return "n/a" if x is None or pd.isna(x) else f"{100 * x:+.3g}%"


def _mb(x: float) -> str:
    return f"{x / 1e6:.3g} MB" if x >= 1e5 else f"{x / 1e3:.3g} kB"


def claim_frontier(o: Outputs) -> Claim:
    summary = frontier_summary(o.frontier)
    n_cases, n_ok = len(summary), int((summary.n_feasible == summary.n_budgets).sum())
    worst = summary.loc[summary.energy_overhead_at_min_peak.idxmax()]
    ours = (f"{n_ok} of {n_cases} (model, platform) frontiers feasible at every budget down to the smallest footprint; "
            f"peak memory cut by {summary.memory_reduction.min():.3g}x to {summary.memory_reduction.max():.3g}x at "
            f"+{100 * summary.energy_overhead_at_min_peak.min():.3g}% to +{100 * worst.energy_overhead_at_min_peak:.3g}% energy "
            f"(worst: {worst.model} on {worst.platform}; MIP gaps up to {100 * summary.max_mip_gap.max():.3g}%)")
    ok = n_ok == n_cases
    return Claim("fig3_frontier", "POET finds energy-efficient schedules on every platform while cutting peak memory and meeting the runtime budget",
                 "Fig. 3", "all four platforms, ResNet-18/50, VGG-16, BERT", ours,
                 "reproduced" if ok else "differs: some budgets have no schedule within the time limit (raise time_limit_s)")


def claim_integrated(o: Outputs) -> Claim:
    table = runtime_comparison(o.runtime, o.gap_tolerance)
    n, ok = len(table), int(table.poet_at_or_below_both.sum())
    saving = table.poet_saving_vs_best_other.dropna()
    strictly = int((saving > 1e-9).sum())
    cases = ", ".join(dict.fromkeys(o.runtime.model + " on " + o.runtime.platform))
    ours = (f"POET at or below both one-lever MILPs at {ok} of {n} runtime budgets ({cases}), strictly below the better one at {strictly}; "
            f"largest saving {_pct(saving.max() if len(saving) else None)}; POET's MIP gaps up to {_pct(table.poet_mip_gap.max())}")
    if ok < n:
        verdict = "differs: at some runtime budgets POET's MILP stopped at its time limit above a one-lever schedule, outside its gap (raise time_limit_s)"
    elif strictly == 0:
        verdict = ("differs: POET is never worse than either lever (it starts from the better one-lever schedule) but found no schedule "
                   "below it within this preset's solver limit; its MIP gap leaves room for one (the full preset gives 300 s per solve)")
    else:
        verdict = "reproduced"
    return Claim("fig4_integrated", "Integrated remat + paging uses less energy than remat only or paging only at every runtime budget",
                 "Fig. 4", "POET lowest at every runtime budget", ours, verdict)


def _capuchin_rows(o: Outputs, method: str) -> pd.DataFrame:
    rows = o.capuchin
    return rows[(rows.method == method) & (rows.budget_fraction < 1) & rows.feasible]


def claim_capuchin(o: Outputs) -> Claim:
    mine = _capuchin_rows(o, "capuchin")
    case = f"{o.capuchin.model.iloc[0]} on {o.capuchin.platform.iloc[0]}"
    paper = f"+{100 * PAPER_CAPUCHIN_OVERHEAD[0]:.0f}% to +{100 * PAPER_CAPUCHIN_OVERHEAD[1]:.0f}% (ResNet-18, A72)"
    if mine.empty:
        return Claim("fig5_capuchin_overhead", "Capuchin's energy grows far above the full-memory baseline as the RAM budget shrinks", "Fig. 5", paper,
                     f"Capuchin has no schedule below full memory ({case})", "differs: Capuchin cannot meet the tighter budgets on our simulator")
    lo, hi = mine.energy_overhead.min(), mine.energy_overhead.max()
    ours = f"{_pct(lo)} to {_pct(hi)} over {len(mine)} budgets ({case})"
    ok = lo >= PAPER_CAPUCHIN_OVERHEAD[0] / 2
    why = ("differs: our Capuchin (a reimplementation; it has no public code) swaps tensors whose transfers hide under compute, and "
           "on the release's cost model paging a tensor costs far less energy than the compute of one step, so its overhead stays small; "
           "the paper measured Capuchin's own runtime-driven recomputation on the device")
    return Claim("fig5_capuchin_overhead", "Capuchin's energy grows far above the full-memory baseline as the RAM budget shrinks", "Fig. 5", paper, ours,
                 "reproduced" if ok else why)


def claim_poet_overhead(o: Outputs) -> Claim:
    mine = _capuchin_rows(o, "poet")
    n = int(((o.capuchin.method == "poet") & (o.capuchin.budget_fraction < 1)).sum())
    case = f"{o.capuchin.model.iloc[0]} on {o.capuchin.platform.iloc[0]}"
    if mine.empty:
        return Claim("fig5_poet_overhead", "POET stays within 1% of the full-memory energy", "Fig. 5", "< 1%", f"no schedule ({case})", "differs: no schedule within the time limit")
    hi = mine.energy_overhead.max()
    ours = f"at most {_pct(hi)} over {len(mine)} of {n} budgets ({case})"
    ok = hi < PAPER_POET_OVERHEAD_BELOW and len(mine) == n
    return Claim("fig5_poet_overhead", "POET stays within 1% of the full-memory energy as the RAM budget shrinks", "Fig. 5", "< 1% (ResNet-18, A72)", ours,
                 "reproduced" if ok else "differs: POET's overhead at the tightest budgets exceeds 1% (see fig5_capuchin.csv)")


def claim_poet_below_capuchin(o: Outputs) -> Claim:
    table = capuchin_table(o.capuchin)
    both = table.dropna(subset=["poet_overhead", "capuchin_overhead"])
    case = f"{o.capuchin.model.iloc[0]} on {o.capuchin.platform.iloc[0]}"
    above = both.poet_overhead > both.capuchin_overhead + 1e-12
    outside_gap = (1 + both.poet_overhead) > (1 + both.capuchin_overhead) * (1 + both.poet_mip_gap + o.gap_tolerance) + 1e-12
    no_poet = int(table.poet_overhead.isna().sum())
    ours = (f"POET at or below Capuchin at {int((~above).sum())} of {len(both)} budgets where both plan ({case})"
            + (f"; above it by at most {_pct((both.poet_overhead - both.capuchin_overhead)[above].max())} of a plain step at {int(above.sum())}, "
               f"{int(outside_gap.sum())} of them outside POET's MIP gap" if above.any() else "")
            + (f"; POET has no schedule at {no_poet}" if no_poet else ""))
    if not above.any() and not no_poet:
        verdict = "reproduced"
    elif not outside_gap.any() and not no_poet:
        verdict = ("differs: POET's MILP stopped at this preset's time limit within its MIP gap of Capuchin's energy, so it is not "
                   f"proven below it; both stay within {_pct(both[['poet_overhead', 'capuchin_overhead']].max().max())} of a plain step here "
                   "(the full preset gives 300 s per solve)")
    else:
        verdict = "differs: POET's MILP stopped at its time limit above Capuchin's schedule, outside its gap (raise time_limit_s)"
    return Claim("fig5_poet_below_capuchin", "POET uses less energy than Capuchin at every RAM budget", "Fig. 5", "POET below Capuchin at every budget", ours, verdict)


def _pofo_claim(o: Outputs, key: str, column: str, paper_value: float, text: str, better: Callable[[float], bool], why: str) -> Claim:
    metrics = pofo_metrics(o.pofo)
    value = metrics[f"mean_{column}"]
    case = "ResNet-18, Jetson TX2"
    ours = f"{_pct(value)} on average over {metrics['n_both_feasible']} budgets where both plan" + (
        f"; POFO has no schedule at {metrics['n_pofo_infeasible']}" if metrics["n_pofo_infeasible"] else "")
    if value is None:
        return Claim(key, text, "Table 3", f"{_pct(paper_value)} ({case})", ours, "differs: no budget where both methods have a schedule")
    if better(value) and abs(value) >= abs(paper_value) / 2:
        return Claim(key, text, "Table 3", f"{_pct(paper_value)} ({case})", ours, "reproduced")
    if abs(value) < 0.01:
        why = ("POET and our POFO reach schedules within 1% of each other here: our POFO plans with POET's energy objective and cost "
               "model on the same simulator, so the paper's difference (POFO minimizing time, on the device) does not appear")
    elif better(value):
        why = f"same direction, smaller than the paper's ({_pct(value)} against {_pct(paper_value)}): our POFO shares POET's energy objective and cost model"
    return Claim(key, text, "Table 3", f"{_pct(paper_value)} ({case})", ours, f"differs: {why}")


def claim_pofo_peak(o: Outputs) -> Claim:
    return _pofo_claim(o, "table3_peak", "poet_peak_change", PAPER_PEAK_CHANGE, "POET needs less peak memory than POFO", lambda v: v < 0,
                       "both plan to the same budget and POET minimizes energy, not peak memory, so it uses the budget when that is cheaper")


def claim_pofo_throughput(o: Outputs) -> Claim:
    return _pofo_claim(o, "table3_throughput", "poet_throughput_change", PAPER_THROUGHPUT_CHANGE, "POET trains faster than POFO", lambda v: v > 0,
                       "POET minimizes energy; on the TX2 a page costs milliseconds of latency, so the energy optimum can be slower than POFO's schedule")


def claim_cortex_m(o: Outputs) -> Claim:
    table = o.feasibility
    rows = table[table.model.isin(["resnet18", "bert"]) & table.platform.isin(CORTEX_M_PLATFORMS)]
    if rows.empty:
        return Claim("cortex_m", "ResNet-18 and BERT fine-tune within the memory of a Cortex-M class device", "Abstract", "fits", "not run in this preset", "differs: not run in this preset (feasibility.models)")
    need = ", ".join(f"{r.model} {_mb(r.min_train_ram_bytes)}" for r in rows.drop_duplicates("model").itertuples())
    largest = max(rows.device_ram_bytes.dropna(), default=None)
    fits = bool(rows.fits_device_ram.all())
    cifar = table[(table.model == "resnet18_cifar") & table.platform.isin(CORTEX_M_PLATFORMS) & table.fits_device_ram.fillna(False).astype(bool)]
    extra = f"; the release's CIFAR ResNet-18 needs {_mb(cifar.min_train_ram_bytes.iloc[0])} and fits {', '.join(cifar.platform)}" if len(cifar) else ""
    ours = f"smallest training memory at batch 1: {need} (Cortex-M RAM at most {_mb(largest) if largest else 'unknown'}){extra}"
    why = ("differs: with the release's ImageNet ResNet-18 and BERT-base (seq 512) graphs, one layer's output and inputs alone exceed a "
           "Cortex-M's SRAM, so no schedule of any method fits; the paper's Cortex-M runs must use smaller inputs or external memory")
    return Claim("cortex_m", "ResNet-18 and BERT fine-tune within the memory of a Cortex-M class device", "Abstract, Fig. 3", "fits (MKR1000 32 kB, nRF52840 256 kB)", ours,
                 "reproduced" if fits else why)


def claim_train_vs_inference(o: Outputs) -> Claim:
    rows = o.memory_ratio[o.memory_ratio.model == "resnet50"]
    if rows.empty:
        return Claim("train_vs_inference", "Training ResNet-50 needs over 200x the memory of inference", "Introduction", "> 200x", "not run in this preset", "differs: not run in this preset (feasibility.models)")
    r = rows.iloc[0]
    ours = f"{r.train_vs_inference:.3g}x activations only, {r.train_vs_inference_with_params:.3g}x with parameters (batch {r.batch_size})"
    ok = r.train_vs_inference > PAPER_TRAIN_INFERENCE_RATIO
    why = ("differs: at batch 1 checkpoint-all keeps 128 MB of activations against about 7 MB at the peak of a forward pass; the paper's "
           "ratio must compare a training batch with single-image inference or count more state (optimizer, workspace)")
    return Claim("train_vs_inference", "Training ResNet-50 needs over 200x the memory of inference", "Introduction", "> 200x", ours, "reproduced" if ok else why)


CLAIMS: tuple[Callable[[Outputs], Claim], ...] = (
    claim_frontier, claim_integrated, claim_capuchin, claim_poet_overhead, claim_poet_below_capuchin, claim_pofo_peak, claim_pofo_throughput, claim_cortex_m,
    claim_train_vs_inference,
)


def claims_table(outputs: Outputs) -> pd.DataFrame:
    return pd.DataFrame([vars(claim(outputs)) for claim in CLAIMS])


def claims_metrics(table: pd.DataFrame) -> dict[str, object]:
    return {"n_claims": int(len(table)), "n_reproduced": int((table.verdict == "reproduced").sum()),
            "verdicts": {row.key: row.verdict.split(":")[0] for row in table.itertuples()}}

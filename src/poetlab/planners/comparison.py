"""POET against every baseline on the same graph, costs, budgets and simulator: one tidy row per
(model, platform, memory budget, method).

Memory budgets form a ladder between the two ends that every method shares: the smallest single-node
footprint (fraction 0, below which no schedule exists) and checkpoint-all's peak (fraction 1, where
nothing needs to be recomputed or paged). A fraction ``f`` is the budget ``footprint + f x (peak -
footprint)``, so the same fractions mean comparable pressure on models of very different sizes.

The MILP methods (POET and its one-lever restrictions) report the solver's status and gap; every other
method reports ``planned`` or ``no schedule`` with its one-line reason. Energy, runtime and peak always
come from the simulator.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import pandas as pd

from poetlab.planners.baselines import BASELINES, Budgets, PlanOptions, run_baseline
from poetlab.planners.baselines.milp_variants import INTEGRATED, MILP_VARIANTS, solve_variant
from poetlab.planners.transfer_order import issue_for_overlap
from poetlab.core.costs import CostModel
from poetlab.errors import InvalidArgumentError, UnknownNameError
from poetlab.progress import progress_bar
from poetlab.core.graph import TrainingGraph
from poetlab.core.paper_models import build_paper_graph
from poetlab.core.platforms import load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import Schedule, SimulationResult, checkpoint_all_schedule, simulate

METHODS: tuple[str, ...] = (*MILP_VARIANTS, *(name for name in BASELINES if name not in MILP_VARIANTS))


@dataclass(frozen=True)
class ComparisonRow:
    """One method at one budget. ``energy_overhead`` is the energy over one plain step's, minus one
    (0.0 means no extra energy at all); None fields mean the method has no schedule. ``runtime_s`` is the
    simulator's (compute and transfers one after the other, the POET paper's model);
    ``overlapped_runtime_s`` the same schedule's with transfers on a stream beside the computations
    (POFO's model, :mod:`poetlab.core.overlap`), its page-ins issued earlier and its page-outs' frees
    later within the RAM budget (:func:`~poetlab.planners.transfer_order.issue_for_overlap`), whose peak
    is ``overlapped_peak_ram_bytes``."""

    model: str
    platform: str
    method: str
    budget_fraction: float
    ram_budget_bytes: int
    runtime_budget_factor: float | None
    feasible: bool
    status: str
    energy_j: float | None
    energy_overhead: float | None
    runtime_s: float | None
    overlapped_runtime_s: float | None
    peak_ram_bytes: int | None
    overlapped_peak_ram_bytes: int | None
    n_recomputes: int | None
    n_pageouts: int | None
    mip_gap: float | None
    plan_time_s: float
    reason: str


def budget_ladder(graph: TrainingGraph, costs: CostModel, fractions: Iterable[float]) -> list[int]:
    """RAM budgets (bytes) at ``fractions`` of the way from the smallest footprint to checkpoint-all's peak
    (both with each operation's workspace, :attr:`TrainingGraph.workspace`, 0 on the paper's graphs), each with
    the bytes :func:`poetlab.solve` keeps free for the whole step added (``graph.reserved_bytes``), so fraction
    0 is the smallest budget a planner can meet."""
    fractions = list(fractions)
    if not fractions or any(not 0 <= f <= 1 for f in fractions):
        raise InvalidArgumentError(f"budget fractions must be a non-empty list of numbers in [0, 1], got {fractions!r}")
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    return [int(graph.reserved_bytes + footprint + f * (peak - footprint)) for f in fractions]


def check_methods(methods: Iterable[str]) -> tuple[str, ...]:
    methods = tuple(methods)
    for method in methods:
        if method not in METHODS:
            raise UnknownNameError("method", method, METHODS)
    return methods


def compare_methods(
    graph: TrainingGraph,
    costs: CostModel,
    fractions: Sequence[float],
    runtime_factor: float | None,
    methods: Sequence[str] = METHODS,
    options: PlanOptions = PlanOptions(),
) -> list[ComparisonRow]:
    """Every method in ``methods`` at every budget of the ladder ``fractions``.

    At each budget the one-lever MILPs (Checkmate's remat-only, paging-only) run before POET, and their
    schedules start POET's MILP in place of its own staged solves (which would solve the same two
    problems again with a quarter of the time limit): POET then gets the whole time limit for itself and
    is never above either restriction, time limit or not. The other methods are independent checks."""
    methods = check_methods(methods)
    order = sorted(methods, key=lambda method: method in INTEGRATED)  # POET last, the rest as given
    plain = costs.plain_step_energy_j
    rows: dict[tuple[float, str], ComparisonRow] = {}
    ladder = list(zip(fractions, budget_ladder(graph, costs, fractions), strict=True))
    jobs = [(f, b, m) for f, b in ladder for m in order]
    starts: dict[float, list[Schedule]] = {f: [] for f, _ in ladder}
    for fraction, ram_bytes, method in progress_bar(jobs, desc=f"{graph.name}/{costs.platform}", unit="plan", leave=False):
        budgets = Budgets(ram_bytes, runtime_factor)
        common = dict(
            model=graph.name, platform=costs.platform, method=method, budget_fraction=float(fraction),
            ram_budget_bytes=ram_bytes, runtime_budget_factor=runtime_factor,
        )
        if method in MILP_VARIANTS:
            solved = solve_variant(method, graph, costs, budgets, options, starts=starts[fraction] if method in INTEGRATED else ())
            if solved.schedule is not None and method not in INTEGRATED:
                starts[fraction].append(solved.schedule)
            schedule, sim, status, gap, seconds, reason = solved.schedule, solved.simulation, solved.status, solved.mip_gap, solved.solve_time_s, solved.message
        else:
            planned = run_baseline(method, graph, costs, budgets, options)
            schedule, sim, gap, seconds, reason = planned.schedule, planned.simulation, None, planned.plan_time_s, planned.reason
            status = "planned" if planned.feasible else "no schedule"
        overlap = None if sim is None else issue_for_overlap(schedule, graph, costs, ram_bytes)
        rows[fraction, method] = ComparisonRow(
            **common, **_measured(sim, plain), status=status, mip_gap=gap, plan_time_s=seconds, reason=reason,
            overlapped_runtime_s=None if overlap is None else overlap.timing.runtime_s,
            overlapped_peak_ram_bytes=None if overlap is None else overlap.simulation.peak_ram_bytes,
        )
    return [rows[fraction, method] for fraction, _ in ladder for method in methods]


def _measured(sim: SimulationResult | None, plain_energy_j: float) -> dict[str, object]:
    if sim is None:
        return dict(feasible=False, energy_j=None, energy_overhead=None, runtime_s=None, peak_ram_bytes=None, n_recomputes=None, n_pageouts=None)
    return dict(
        feasible=True, energy_j=sim.energy_j, energy_overhead=sim.energy_j / plain_energy_j - 1, runtime_s=sim.runtime_s,
        peak_ram_bytes=sim.peak_ram_bytes, n_recomputes=sim.n_recomputes, n_pageouts=sim.n_pageouts,
    )


def comparison_table(
    cases: Sequence[Sequence[str]],
    fractions: Sequence[float],
    runtime_factor: float | None,
    methods: Sequence[str] = METHODS,
    time_limit_s: float = 60.0,
    threads: int | None = None,
    batch_size: int = 1,
) -> pd.DataFrame:
    """The comparison for each ``(model, platform)`` of ``cases``, as one table. Every name is checked
    before any planning starts, so a typo fails at once."""
    check_methods(methods)
    pairs = [(build_paper_graph(model, batch_size), load_platform(platform)) for model, platform in cases]
    options = PlanOptions(time_limit_s=time_limit_s, threads=threads)
    rows = [
        asdict(row)
        for graph, platform in progress_bar(pairs, desc="comparison", unit="case")
        for row in compare_methods(graph, CostModel.from_flops(graph, platform), fractions, runtime_factor, methods, options)
    ]
    return pd.DataFrame(rows, columns=[field for field in ComparisonRow.__dataclass_fields__])


def comparison_metrics(table: pd.DataFrame) -> dict[str, object]:
    """The numbers a reviewer checks first, per case and method: at how many budgets the method has a
    schedule, its worst energy overhead, and every row where a method beats POET (expected only where
    POET stopped at its time limit, within its gap: anything else is a bug in one of the two)."""
    metrics: dict[str, object] = {"n_rows": int(len(table))}
    for (model, platform), case in table.groupby(["model", "platform"], sort=False):
        per_method = {}
        for method, rows in case.groupby("method", sort=False):
            feasible = rows[rows.feasible]
            per_method[method] = {
                "n_feasible": int(len(feasible)),
                "max_energy_overhead": None if feasible.empty else float(feasible.energy_overhead.max()),
            }
        metrics[f"{model}/{platform}"] = per_method
    poet = table[table.method == "poet"].set_index(["model", "platform", "budget_fraction"])
    below = []
    for row in table[(table.method != "poet") & table.feasible].itertuples():
        key = (row.model, row.platform, row.budget_fraction)
        if key not in poet.index:
            continue
        reference = poet.loc[key]
        if not reference.feasible or row.energy_j < reference.energy_j * (1 - 1e-9):
            gap = None if pd.isna(reference.mip_gap) else float(reference.mip_gap)
            below.append({"case": f"{row.model}/{row.platform}", "budget_fraction": row.budget_fraction, "method": row.method,
                          "energy_j": row.energy_j, "poet_energy_j": reference.energy_j, "poet_status": reference.status, "poet_gap": gap})
    metrics["methods_below_poet"] = below
    return metrics

"""``poetlab.solve``: an energy-optimal schedule for a training graph under memory and runtime budgets.

The steps, each cheap before the expensive one:

1. Check the inputs (budgets, solver name, limits) and give a one-line error for bad ones.
2. A budget below the smallest single-node footprint (a node's output plus its inputs, all in RAM at
   once) is infeasible for every schedule: say so without building a MILP.
3. Every node must be computed at least once, so the energy of one plain step is a lower bound for
   every schedule. If checkpoint-all (no recomputation, no paging) fits the budgets, it meets that
   bound and is optimal: a certificate, with no MILP to solve.
4. Otherwise prove the eviction bound (:mod:`poetlab.planners.poet.bounds`); a quick schedule within the gap of it is
   optimal. Else, where the best start is near the bound and the bound's cover fills the runtime budget's slack with
   recomputations, the interval relaxation restricted to them gives a schedule (:mod:`poetlab.planners.poet.primal`);
   then, where the best start is near the bound, solve the interval relaxation
   (:mod:`poetlab.planners.poet.intervals`, without its kept-through and idle-gap rows) from the best start
   for a share of the time limit (the stage relaxation, :mod:`poetlab.planners.poet.relaxation`, where the
   interval relaxation makes no schedules: without recomputation, with page-ins charged): its bound joins
   the eviction bound, its solution made into a schedule joins the starts, and a start within the gap of
   the better bound is optimal. Where the best start is far above the bound (at once, or after the stage
   relaxation raised it), solve the interval relaxation (:mod:`poetlab.planners.poet.intervals`) for a
   share of the time limit: its bound joins the others, and its solutions (at the budget and at the
   budget less a margin) made into schedules join the starts. From a 30 s limit, CP-SAT (:mod:`poetlab.planners.poet.cpsat`,
   in its own process) solves the interval relaxation from a near, uncertified start. Around the relaxations, the starts
   over a budget are repaired and the fitting ones made cheaper (:mod:`poetlab.planners.poet.repair`), the relaxations'
   schedules that do not fit among them. Else build the POET MILP and solve it, started from the cheapest quick schedule
   (:mod:`poetlab.planners.poet.starts`: greedy paging and greedy remat, DTR and Capuchin, the bound's covers) so that a solve stopped by its time limit still has a valid
   schedule, never worse than those. The schedule it returns is replayed by the simulator, whose energy, runtime
   and peak are what we report; the solver's own objective is kept only to show that the two agree.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Sequence
from dataclasses import dataclass


from poetlab.planners.poet.bounds import eviction_cover
from poetlab.core.costs import CostModel, check_graph_and_costs
from poetlab.errors import InvalidArgumentError, PoetlabError, UnknownNameError
from poetlab.core.graph import TrainingGraph, min_footprint_bytes
from poetlab.planners.compression import compress_all_schedule
from poetlab.planners.poet.milp import MilpOptions, build_milp
from poetlab.planners.poet.neighbourhood import fits_milp, improve
from poetlab.planners.poet.cpsat import cpsat_available, interval_bound_cpsat
from poetlab.planners.poet.intervals import interval_bound, interval_start
from poetlab.planners.poet.primal import cover_fills_slack, cover_restricted
from poetlab.planners.poet.relaxation import stage_relaxation
from poetlab.planners.poet.starts import QUICK_STARTS, best_start, better, milp_seeds
from poetlab.planners.poet.repair import Budgets as RepairBudgets, loose_starts, repair_all
from poetlab.core.schedule import InvalidScheduleError, Schedule, SimulationResult, checkpoint_all_schedule, simulate
from poetlab.planners.poet.backends import SOLVERS, relative_gap, run_milp

log = logging.getLogger("poetlab.poet_solver")

STATUSES = ("optimal", "feasible", "infeasible", "time_limit")
# Below this time limit the staged one-lever solves are skipped: a quarter of a few seconds buys them
# nothing the quick starts do not already give, and the whole solve must end near its limit.
STAGED_MIN_TIME_LIMIT_S = 10.0
#: the share of the time limit the stage relaxation may take near the bound, where the interval relaxation makes no
#: schedules (without recomputation, with page-ins charged; docs/solve.md, NOTE 3)
RELAXATION_SHARE = 0.4
#: and the share the interval relaxation from the best start takes there otherwise, and its most seconds (NOTE 13:
#: it certified vgg16_cifar/m4/10% in about a second where the stage relaxation took 6-9 s, and bert/jetsontx2 at its
#: smallest footprint, which nothing certified before, where its root takes 3-5 s under load; at 30 s it took time
#: from the repair and the window search on the 60 s grid's near rows; on bert/m4/0.5/2x its solution that repairs to
#: about 1.0153 comes at 9.6 s at load 4, so 16 s leaves room for a loaded machine, NOTE 16)
NEAR_INTERVAL_SHARE = 0.5
NEAR_INTERVAL_MAX_S = 16.0
#: below this time limit the relaxation is skipped (its worker and presolve would take the share)
RELAXATION_MIN_TIME_LIMIT_S = 5.0
#: the share of the time limit the window search may take (:mod:`poetlab.planners.poet.neighbourhood`:
#: better schedules where HiGHS finds none in the whole MILP; docs/solve.md, NOTE 4), and the limit below
#: which it is skipped
NEIGHBOURHOOD_SHARE = 0.6
NEIGHBOURHOOD_MIN_TIME_LIMIT_S = 5.0
#: below this many columns the window search is skipped: HiGHS works on POET's whole MILP, whose solve
#: can also prove the optimum (the window search's time would come out of that solve's)
NEIGHBOURHOOD_MIN_COLUMNS = 10_000
#: the share of the time limit the interval relaxation may take (a third for its bound, the rest for a start), and
#: the limit below which it is skipped (:mod:`poetlab.planners.poet.intervals`: a bound that charges a
#: recomputation its inputs, and a schedule that rebuilds from checkpoints where the other starts page;
#: docs/solve.md, NOTE 5)
INTERVAL_SHARE = 0.4
INTERVAL_MIN_TIME_LIMIT_S = 5.0
#: and the most seconds it takes whatever the limit (longer limits go to the relaxation and the windows)
INTERVAL_MAX_S = 30.0
#: it runs after the stage relaxation, and only where a quick start fits this far above the lower bound:
#: its schedules pay where the starts are far from a segment rebuild, and elsewhere its share of the
#: time is better spent by the stage relaxation and the windows (docs/solve.md, "Where `solve` runs it")
INTERVAL_MIN_START_GAP = 0.05
#: where the best start is that far above the bound already after the quick starts and the first repair, the
#: stage relaxation is skipped and the interval relaxation runs at once with this share of the limit (at most
#: ``INTERVAL_MAX_S``, less the second repair's share): there the stage relaxation's root took its 40% and
#: proved nothing the interval relaxation does not, while the interval relaxation's schedules, repaired, are
#: the ones that pay (docs/solve.md, NOTE 11)
INTERVAL_FAR_SHARE = 0.5
#: the least seconds for the interval relaxation from the best start after the far path (docs/solve.md, NOTE 15)
NEAR_AFTER_FAR_MIN_S = 2.0
#: the share of the time limit each of the two repairs may take, its least and most seconds (:mod:`poetlab.planners.poet.repair`:
#: starts over a budget made to fit, then the fitting starts made cheaper, by simulator-checked single-tensor
#: changes; docs/solve.md, NOTE 6), and the limit below which the first is skipped
REPAIR_SHARE = 0.1
REPAIR_MIN_S = 1.0
REPAIR_MAX_S = 6.0
REPAIR_MIN_TIME_LIMIT_S = 2.0
#: and the limit below which the second repair (after the relaxations: their schedules, the fitting starts) is skipped
REPAIR_AGAIN_MIN_TIME_LIMIT_S = 5.0
#: and what that second repair may take, with the ejection chains (twice the first's: on bert/m4 at 50% the first chain that pays takes about 1 s; NOTE 9)
REPAIR_AGAIN_SHARE = 0.2
REPAIR_AGAIN_MIN_S = 2.0
REPAIR_AGAIN_MAX_S = 12.0
#: from this limit on, where the interval relaxation raised the bound more than the gap above the eviction bound and the best start
#: is within 5% of it, uncertified, CP-SAT solves it (up to this many columns) from that start, for the time left less 2 s (NOTE 14)
CPSAT_MIN_TIME_LIMIT_S = 30.0
CPSAT_MAX_COLUMNS = 50_000
#: near the bound (the best start within INTERVAL_MIN_START_GAP of it after the first repair), from this limit on, where
#: the eviction cover's recomputations take nearly all of the runtime budget's slack and its schedule (NOTE 2) is within
#: INTERVAL_MIN_START_GAP of the bound too, the interval relaxation restricted to them (:mod:`poetlab.planners.poet.primal`) looks for a
#: schedule for this share of the limit, at most this many seconds, stopped once its solution certifies (NOTE 18: on
#: Fig. 4's resnet18/m4/0.2/1.000177x, 3.6 s to a schedule within 0.05% of the eviction bound)
PRIMAL_MIN_TIME_LIMIT_S = 30.0
PRIMAL_SHARE = 0.15
PRIMAL_MAX_S = 8.0
#: the least time left for which POET's MILP starts on a graph of 100 nodes or more (NEIGHBOURHOOD_MIN_COLUMNS
#: of R and S_RAM); with less, the solve is at or past its limit and returns its best start: HiGHS needs longer
#: than that to read and presolve such a model (resnet50: 424k columns, stopped after 1.5 s with nothing new)
MILP_MIN_LEFT_S = 1.0
BOUNDS = ("eviction", "trivial")


@dataclass(frozen=True)
class SolveResult:
    """The outcome of :func:`solve`. Energies, runtime and peak come from the simulator.

    ``objective_j`` is the solver's objective (None for a certificate or no solution) and ``bound_j``
    the best proven lower bound on the energy; ``mip_gap`` is their relative difference. ``solver`` is
    ``highs``, ``gurobi``, or ``bound`` when no MILP ran: the lower-bound certificate settled it, or the
    time limit left too little for POET's MILP on a large graph (``MILP_MIN_LEFT_S``). ``message`` says
    in one line why there is no schedule, when there is none.
    """

    status: str
    solver: str
    energy_j: float | None
    compute_energy_j: float | None
    pagein_energy_j: float | None
    pageout_energy_j: float | None
    runtime_s: float | None
    peak_ram_bytes: int | None
    solve_time_s: float
    mip_gap: float | None
    objective_j: float | None
    bound_j: float | None
    n_recomputes: int | None
    n_pageouts: int | None
    n_pageins: int | None
    ram_budget_bytes: float
    runtime_budget_s: float | None
    message: str
    schedule: Schedule | None = None
    simulation: SimulationResult | None = None
    compression_energy_j: float | None = None
    n_compresses: int | None = None

    @property
    def feasible(self) -> bool:
        return self.schedule is not None

    def to_dict(self) -> dict[str, object]:
        """The JSON-able fields (no schedule or memory trace)."""
        return {
            name: getattr(self, name)
            for name in (
                "status", "energy_j", "compute_energy_j", "pagein_energy_j", "pageout_energy_j", "runtime_s",
                "peak_ram_bytes", "solve_time_s", "mip_gap", "solver", "n_recomputes", "n_pageouts", "n_pageins",
                "objective_j", "bound_j", "ram_budget_bytes", "runtime_budget_s", "message", "compression_energy_j",
                "n_compresses",
            )
        }


def _check(ram_budget_bytes: float, runtime_budget_factor: float | None, solver: str, time_limit_s: float, mip_gap: float, threads: int | None, bound: str = "eviction") -> None:
    if isinstance(ram_budget_bytes, bool) or not isinstance(ram_budget_bytes, numbers.Real) or not (math.isfinite(ram_budget_bytes) and ram_budget_bytes > 0):
        raise InvalidArgumentError(f"RAM budget must be a positive number of bytes, got {ram_budget_bytes!r}")
    for name, value in (("runtime_budget_factor", runtime_budget_factor), ("time_limit_s", time_limit_s), ("mip_gap", mip_gap)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise InvalidArgumentError(f"solve: {name} must be a number, got {value!r}")
    if runtime_budget_factor is not None and not (math.isfinite(runtime_budget_factor) and runtime_budget_factor >= 1):
        raise InvalidArgumentError(
            f"runtime budget must be a factor >= 1 of one plain step (every node runs at least once), got {runtime_budget_factor!r}"
        )
    if solver not in SOLVERS:
        raise InvalidArgumentError(f"unknown solver {solver!r}; valid solvers: {', '.join(SOLVERS)}")
    if not (math.isfinite(time_limit_s) and time_limit_s > 0):
        raise InvalidArgumentError(f"time limit must be a positive number of seconds, got {time_limit_s!r}")
    if not (0 <= mip_gap < 1):
        raise InvalidArgumentError(f"MIP gap must be in [0, 1), got {mip_gap!r}")
    if bound not in BOUNDS:
        raise InvalidArgumentError(f"unknown bound {bound!r}; valid bounds: {', '.join(BOUNDS)}")
    if threads is not None and threads < 1:
        raise InvalidArgumentError(f"threads must be a positive integer, got {threads!r}")


def solve(
    graph: TrainingGraph,
    costs: CostModel,
    ram_budget_bytes: float,
    runtime_budget_factor: float | None = None,
    *,
    paging: bool = True,
    remat: bool = True,
    count_paging_time: bool = False,
    charge_pagein: bool = False,
    params_in_budget: bool = False,
    compression: bool = False,
    solver: str = "auto",
    time_limit_s: float = 600.0,
    mip_gap: float = 1e-4,
    threads: int | None = None,
    verbose: bool = False,
    staged: bool = True,
    starts: Sequence[Schedule] = (),
    bound: str = "eviction",
    exclude_starts: Sequence[str] = (),
) -> SolveResult:
    """The minimum-energy schedule of ``graph`` within ``ram_budget_bytes`` and ``runtime_budget_factor``
    times one plain step. Faithful to the POET release unless one of the fix options is set (see
    :mod:`poetlab.planners.poet.milp`).

    With both levers allowed and ``staged`` (the default), the two smaller problems (remat only, paging
    only) are solved first with a quarter of the time limit each, and the better of their schedules
    starts POET's MILP for the rest of the time: POET is then never worse than either restriction
    found, even when its own solve stops at the time limit. (Not below ``STAGED_MIN_TIME_LIMIT_S``.)

    With ``compression`` (which needs ``costs.compression``), tensors may also be kept compressed in
    RAM (:mod:`poetlab.techniques.compression`). POET without compression is solved first with half the
    time limit, and its schedule, which is feasible for the larger problem, starts it, as does BitTrain's
    policy (:func:`~poetlab.planners.compression.compress_all_schedule`) where it fits and is cheaper:
    the answer is never worse than either. (Two time-limited solves are not bit-for-bit repeatable, so a
    separate POET solve with the same limit can land a little lower or higher; optimal ones agree.)

    ``bound``: ``eviction`` (default) proves a lower bound before the MILP (:func:`poetlab.planners.poet.bounds.eviction_bound`:
    the cheapest regeneration of what the budget cannot hold), then, if no start meets it, solves the
    interval relaxation from the best start (:func:`poetlab.planners.poet.intervals.interval_bound`; the stage
    relaxation, :func:`poetlab.planners.poet.relaxation.stage_relaxation`, without recomputation or with page-ins
    charged; ``NEAR_INTERVAL_SHARE``, resp. ``RELAXATION_SHARE``, of a time limit of ``RELAXATION_MIN_TIME_LIMIT_S`` or more) for a second bound
    and a start; the solve ends as soon as a schedule is within
    ``mip_gap`` of the better bound. ``trivial`` keeps one plain step's energy, as before them (benchmarks).

    ``starts`` are schedules of your own (another planner's, a previous solve's) that POET should start
    from: each is replayed within the budgets, and the cheapest that fits competes with the greedy and
    staged starts. The result is never more expensive than the best start, time limit or not.
    ``exclude_starts`` leaves out quick starts by name (:data:`QUICK_STARTS`), e.g. ``("capuchin",)`` to
    compare POET with Capuchin on a solve that did not start from Capuchin's schedule.
    """
    check_graph_and_costs("solve", graph, costs)
    _check(ram_budget_bytes, runtime_budget_factor, solver, time_limit_s, mip_gap, threads, bound)
    for name in exclude_starts:
        if name not in QUICK_STARTS:
            raise UnknownNameError("start", name, QUICK_STARTS)
    if compression and costs.compression is None:
        raise InvalidArgumentError("compression needs compression costs in the cost model: CostModel.with_compression(compression_costs(...))")
    started = time.perf_counter()
    options = MilpOptions(
        ram_budget_bytes=float(ram_budget_bytes),
        runtime_budget_factor=runtime_budget_factor,
        paging=paging,
        remat=remat,
        count_paging_time=count_paging_time,
        charge_pagein=charge_pagein,
        params_in_budget=params_in_budget,
        compression=compression,
    )
    # (kept free: parameters and gradients where asked, and the RNG states an executor keeps for the whole step:
    # TrainingGraph.reserved_bytes; each operation's workspace is counted while it runs: TrainingGraph.workspace)
    fixed = (2 * graph.param_bytes if params_in_budget else 0) + graph.reserved_bytes
    runtime_budget_s = None if runtime_budget_factor is None else runtime_budget_factor * costs.plain_step_runtime_s
    lower_bound = costs.plain_step_energy_j

    def result(status: str, solver_name: str, message: str, schedule=None, sim=None, objective=None, bound=None, gap=None) -> SolveResult:
        return SolveResult(
            status=status,
            solver=solver_name,
            energy_j=sim.energy_j if sim else None,
            compute_energy_j=sim.compute_energy_j if sim else None,
            pagein_energy_j=sim.pagein_energy_j if sim else None,
            pageout_energy_j=sim.pageout_energy_j if sim else None,
            runtime_s=sim.runtime_s if sim else None,
            peak_ram_bytes=sim.peak_ram_bytes if sim else None,
            solve_time_s=time.perf_counter() - started,
            mip_gap=gap,
            objective_j=objective,
            bound_j=bound,
            n_recomputes=sim.n_recomputes if sim else None,
            n_pageouts=sim.n_pageouts if sim else None,
            n_pageins=sim.n_pageins if sim else None,
            ram_budget_bytes=float(ram_budget_bytes),
            runtime_budget_s=runtime_budget_s,
            message=message,
            schedule=schedule,
            simulation=sim,
            compression_energy_j=sim.compression_energy_j if sim else None,
            n_compresses=sim.n_compresses if sim else None,
        )

    def replay(schedule: Schedule) -> SimulationResult:
        return simulate(
            schedule, graph, costs, ram_budget_bytes=ram_budget_bytes, runtime_budget_s=runtime_budget_s,
            count_paging_time=count_paging_time, fixed_bytes=fixed,
        )

    footprint, node = min_footprint_bytes(graph)
    if footprint + fixed > ram_budget_bytes:
        extra = f" plus {fixed:,} bytes kept free beside the tensors (parameters and gradients where asked, RNG states and shared-weight gradients: TrainingGraph.reserved_bytes)" if fixed else ""
        message = (
            f"the RAM budget {int(ram_budget_bytes):,} bytes is below the smallest single-node footprint "
            f"{footprint:,} bytes{extra} (node {graph.nodes[node].name} needs its inputs and output{' and workspace' if graph.workspace[node] else ''} in RAM at once)"
        )
        log.info(message)
        return result("infeasible", "bound", message)

    baseline = checkpoint_all_schedule(graph)
    try:
        sim = replay(baseline)
    except InvalidScheduleError:
        sim = None
    if sim is not None:
        message = "checkpoint-all fits the budgets and meets the lower bound (every node computed once): optimal without a MILP"
        log.info(message)
        return result("optimal", "bound", message, baseline, sim, objective=sim.energy_j, bound=lower_bound, gap=0.0)

    cover = None
    if bound == "eviction":
        cover = eviction_cover(graph, costs, options, time_limit_s=min(10.0, 0.1 * time_limit_s))
        lower_bound = max(lower_bound, cover.bound_j)
    evicted_j = lower_bound
    log.info("lower bound: %.10g J (%.6f x one plain step)", lower_bound, lower_bound / costs.plain_step_energy_j)
    fitting: list[tuple[Schedule, SimulationResult]] = []  # every start that replays within the budgets
    quick: dict[str, float] = {}  # and each quick start's least energy within them, by name
    rejected: list[Schedule] = []  # and every one that does not, for the repair
    start, start_sim = best_start(graph, costs, options, runtime_budget_s, replay, covers_s=min(2.0, 0.05 * time_limit_s) if bound == "eviction" else 0.0, deadline=started + time_limit_s, exclude=exclude_starts, collect=fitting, rejected=rejected, energies=quick)
    for given in starts:
        try:
            given_sim = replay(given)
        except InvalidScheduleError as exc:
            log.info("a given start does not fit the budgets (%s); ignoring it", exc.reason)
            continue
        fitting.append((given, given_sim))
        if start_sim is None or given_sim.energy_j < start_sim.energy_j:
            start, start_sim = given, given_sim

    def proven() -> bool:  # the best start is within the gap of the lower bound: nothing left to solve
        return start_sim is not None and relative_gap(start_sim.energy_j, lower_bound) <= mip_gap

    def certifying_j() -> float:  # the bound at which the best start is within the gap: a relaxation's target
        return start_sim.energy_j * (1 - mip_gap) * (1 + 1e-9)

    repair_budgets = RepairBudgets(float(ram_budget_bytes), runtime_budget_s, fixed, count_paging_time, charge_pagein, paging, remat)
    repair_s = min(max(REPAIR_SHARE * time_limit_s, REPAIR_MIN_S), REPAIR_MAX_S, time_limit_s / 2)  # what each of the two repairs may take

    def repaired(schedules: list[Schedule], share_s: float, chains: bool) -> tuple[Schedule | None, SimulationResult | None]:
        best = (start, start_sim)
        for schedule in repair_all(graph, costs, schedules, repair_budgets, time_limit_s=min(share_s, started + time_limit_s - time.perf_counter()), chains=chains):
            best = better(best, "repaired", schedule, replay, collect=fitting)
        return best

    if bound == "eviction" and not compression and time_limit_s >= REPAIR_MIN_TIME_LIMIT_S and not proven():
        loose = loose_starts(graph, costs, repair_budgets, exclude=exclude_starts)
        # (single changes only: the fitting starts' turn, with the ejection chains, comes after the relaxations, whose bounds
        # need the time more, and which run only while the best start is far from the bound: docs/solve.md, NOTE 9)
        start, start_sim = repaired(loose + rejected, repair_s, chains=False)
        log.info("after the repair: %s", "no schedule" if start_sim is None else f"{start_sim.energy_j:.10g} J")
    repaired_before = len(rejected)
    # where the cover's own schedule is near the bound (so the best start, no dearer, is too) and its recomputations fill
    # the runtime budget's slack: the interval relaxation restricted to those recomputations (NOTE 18), for a start
    near_cover = "eviction cover" in quick and relative_gap(quick["eviction cover"], lower_bound) <= INTERVAL_MIN_START_GAP
    if (
        near_cover and cover is not None and cover.recompute is not None and cover_fills_slack(costs, options, cover.recompute)
        and not compression and remat and not charge_pagein and time_limit_s >= PRIMAL_MIN_TIME_LIMIT_S and not proven()
    ):
        share = min(PRIMAL_SHARE * time_limit_s, PRIMAL_MAX_S, started + time_limit_s - time.perf_counter())
        found = cover_restricted(graph, costs, options, cover.recompute, time_limit_s=max(0.1, share), floor_j=lower_bound / (1 - mip_gap), mip_gap=mip_gap / 2, max_columns=CPSAT_MAX_COLUMNS)
        start, start_sim = better((start, start_sim), "cover-restricted relaxation", found.schedule, replay, collect=fitting, rejected=rejected)

    def from_best_start(share_s: float, floor_j: float | None = None) -> tuple[float, Schedule | None, SimulationResult | None, float | None]:
        """(lower bound, best start, its simulation, the relaxation's incumbent in J) after NOTE 13's relaxation from the best start (``floor_j``: NOTE 15)."""
        warm = interval_bound(graph, costs, options, time_limit_s=share_s, mip_gap=mip_gap / 2, kept_rows=False, start=start, target_j=certifying_j(), floor_j=floor_j)
        bound_j = max(lower_bound, warm.bound_j)
        log.info("lower bound after the interval relaxation from the best start: %.10g J (%.6f x one plain step, %s, %.1f s)", bound_j, bound_j / costs.plain_step_energy_j, "optimal" if warm.optimal else "stopped", warm.seconds)
        return (bound_j, *better((start, start_sim), "interval relaxation from the best start", warm.schedule, replay, collect=fitting, rejected=rejected), None if warm.incumbent is None else warm.incumbent * costs.plain_step_energy_j)

    again_s = min(max(REPAIR_AGAIN_SHARE * time_limit_s, REPAIR_AGAIN_MIN_S), REPAIR_AGAIN_MAX_S, time_limit_s / 2)  # the second repair's share
    # (only where the interval relaxation makes schedules: with recomputation, page-ins not charged as they land)
    far_at_once = remat and not charge_pagein and start_sim is not None and relative_gap(start_sim.energy_j, lower_bound) > INTERVAL_MIN_START_GAP
    if bound == "eviction" and not compression and time_limit_s >= RELAXATION_MIN_TIME_LIMIT_S and not far_at_once and not proven():
        remaining = started + time_limit_s - time.perf_counter()
        if remat and not charge_pagein and start_sim is not None:  # near the bound: the interval relaxation from the best start (NOTE 13)
            lower_bound, start, start_sim, _ = from_best_start(max(0.1, min(NEAR_INTERVAL_SHARE * time_limit_s, NEAR_INTERVAL_MAX_S, remaining - again_s)))  # (the second repair keeps its share)
        else:
            relaxed = stage_relaxation(graph, costs, options, time_limit_s=max(0.1, min(RELAXATION_SHARE * time_limit_s, remaining)), mip_gap=mip_gap / 2, start=start)
            lower_bound = max(lower_bound, relaxed.bound_j)
            start, start_sim = better((start, start_sim), "stage relaxation", relaxed.schedule, replay, collect=fitting, rejected=rejected)
            log.info("lower bound after the stage relaxation: %.10g J (%.6f x one plain step)", lower_bound, lower_bound / costs.plain_step_energy_j)

    far = start_sim is not None and relative_gap(start_sim.energy_j, lower_bound) > INTERVAL_MIN_START_GAP
    if bound == "eviction" and not compression and time_limit_s >= INTERVAL_MIN_TIME_LIMIT_S and far and not proven():
        remaining = started + time_limit_s - time.perf_counter()
        if far_at_once:  # (the stage relaxation was skipped: its share, less what the second repair needs)
            share = min(INTERVAL_FAR_SHARE * time_limit_s, INTERVAL_MAX_S, remaining - again_s)
            log.info("the best start is %.1f%% above the bound: the interval relaxation first, for %.1f s (the stage relaxation skipped)", 100 * relative_gap(start_sim.energy_j, lower_bound), share)
        else:
            share = min(INTERVAL_SHARE * time_limit_s, INTERVAL_MAX_S, remaining)
        interval_j, schedules, relaxed_j = interval_start(graph, costs, options, time_limit_s=max(0.1, share))
        lower_bound = max(lower_bound, interval_j)
        for schedule in schedules:
            start, start_sim = better((start, start_sim), "interval relaxation", schedule, replay, collect=fitting, rejected=rejected)
        log.info("lower bound after the interval relaxation: %.10g J (%.6f x one plain step)", lower_bound, lower_bound / costs.plain_step_energy_j)

    near = start_sim is not None and relative_gap(start_sim.energy_j, lower_bound) <= INTERVAL_MIN_START_GAP  # (far: the repair's and the windows' turn)
    if bound == "eviction" and not compression and remat and not charge_pagein and near and time_limit_s >= CPSAT_MIN_TIME_LIMIT_S and lower_bound > evicted_j * (1 + mip_gap) and not proven():
        available, why = cpsat_available()
        share = started + time_limit_s - time.perf_counter() - REPAIR_AGAIN_MIN_S
        if not available:
            log.info("%s; CP-SAT skipped", why)
        elif share >= 1.0:
            log.info("CP-SAT on the interval relaxation from the best start for %.1f s (%s; the best start %.3f%% above the bound)", share, why, 100 * relative_gap(start_sim.energy_j, lower_bound))
            found = interval_bound_cpsat(graph, costs, options, time_limit_s=share, mip_gap=mip_gap / 2, start=start, target_j=certifying_j(), max_columns=CPSAT_MAX_COLUMNS)
            lower_bound = max(lower_bound, found.bound_j)
            start, start_sim = better((start, start_sim), "CP-SAT", found.schedule, replay, collect=fitting, rejected=rejected)

    if bound == "eviction" and not compression and time_limit_s >= REPAIR_AGAIN_MIN_TIME_LIMIT_S and not proven():
        start, start_sim = repaired(rejected[repaired_before:] + [schedule for schedule, _ in fitting], again_s, chains=True)  # the relaxations' schedules, and every fitting start made cheaper

    # the far path's schedules, repaired, brought the best start near the bound: the near path's relaxation from it (NOTE 15)
    if bound == "eviction" and not compression and far and remat and not charge_pagein and time_limit_s >= INTERVAL_MIN_TIME_LIMIT_S and not proven() and relative_gap(start_sim.energy_j, lower_bound) <= INTERVAL_MIN_START_GAP:
        share = min(NEAR_INTERVAL_SHARE * time_limit_s, NEAR_INTERVAL_MAX_S, started + time_limit_s - time.perf_counter() - REPAIR_MIN_S)
        if share < NEAR_AFTER_FAR_MIN_S or (relaxed_j is not None and relaxed_j < lower_bound):
            log.info("the best start is %.2f%% above the bound after the far path: the interval relaxation from it skipped (%s)", 100 * relative_gap(start_sim.energy_j, lower_bound), f"{share + REPAIR_MIN_S:.1f} s left" if share < NEAR_AFTER_FAR_MIN_S else "it has a solution below the bound")
        else:
            log.info("the best start is %.2f%% above the bound after the far path: the interval relaxation from it, for %.1f s", 100 * relative_gap(start_sim.energy_j, lower_bound), share)
            unrepaired, floor_j = len(rejected), lower_bound
            lower_bound, start, start_sim, incumbent_j = from_best_start(share, floor_j=floor_j)
            if rejected[unrepaired:] and not proven() and incumbent_j is not None and incumbent_j >= floor_j:  # its schedule, over a budget (one below the bound cannot fit)
                start, start_sim = repaired(rejected[unrepaired:], REPAIR_AGAIN_MAX_S, chains=True)

    model = None
    if bound == "eviction" and not compression and time_limit_s >= NEIGHBOURHOOD_MIN_TIME_LIMIT_S and not proven():
        model = build_milp(graph, costs, options)
    if model is not None and model.n_cols >= NEIGHBOURHOOD_MIN_COLUMNS:
        remaining = started + time_limit_s - time.perf_counter()
        seeds = milp_seeds(graph, model, fitting, replay, charge_pagein)
        if not seeds:
            log.info("window search skipped: no start is a solution of POET's MILP")
        elif remaining > 1.0:
            found = improve(graph, model, seeds, replay, time_limit_s=min(NEIGHBOURHOOD_SHARE * time_limit_s, remaining), target_j=lower_bound / (1 - mip_gap), prefetch=charge_pagein)
            start, start_sim = better((start, start_sim), "window search", found[0], replay)

    if compression and not proven():
        plain = solve(
            graph, costs, ram_budget_bytes, runtime_budget_factor, paging=paging, remat=remat, count_paging_time=count_paging_time,
            charge_pagein=charge_pagein, params_in_budget=params_in_budget, solver=solver, time_limit_s=time_limit_s / 2,
            mip_gap=mip_gap, threads=threads, verbose=verbose, staged=staged, starts=starts, bound=bound, exclude_starts=exclude_starts,
        )
        log.info("staged: POET without compression gives %s (%s)", plain.energy_j, plain.status)
        if plain.simulation is not None and (start_sim is None or plain.energy_j < start_sim.energy_j):
            start, start_sim = plain.schedule, plain.simulation
        try:  # BitTrain's policy (every step computed once, every allowed output compressed while idle)
            bittrain_sim = replay(bittrain := compress_all_schedule(graph, costs.compression))
        except InvalidScheduleError:
            bittrain_sim = None
        if bittrain_sim is not None and (start_sim is None or bittrain_sim.energy_j < start_sim.energy_j):
            log.info("compress-all start: %.10g J", bittrain_sim.energy_j)
            start, start_sim = bittrain, bittrain_sim
    elif staged and paging and remat and time_limit_s >= STAGED_MIN_TIME_LIMIT_S and not proven():
        for label, flags in (("remat only", {"paging": False}), ("paging only", {"remat": False})):
            # a quarter of the limit each, less where the relaxation and the window search took theirs
            share = min(time_limit_s / 4, (started + time_limit_s - time.perf_counter()) / 3)
            if proven() or share < 1.0:
                break
            restricted = solve(
                graph, costs, ram_budget_bytes, runtime_budget_factor, count_paging_time=count_paging_time, exclude_starts=exclude_starts,
                charge_pagein=charge_pagein, params_in_budget=params_in_budget, solver=solver,
                time_limit_s=share, mip_gap=mip_gap, threads=threads, verbose=verbose, bound=bound, **flags,
            )
            found = f"{restricted.energy_j:.10g} J" if restricted.energy_j is not None else "no schedule"
            log.info("staged: %s gives %s (%s)", label, found, restricted.status)
            if restricted.simulation is not None and (start_sim is None or restricted.energy_j < start_sim.energy_j):
                start, start_sim = restricted.schedule, restricted.simulation
    if proven():
        message = f"the best start meets the lower bound within the gap {mip_gap:g}: optimal without a MILP solve"
        log.info(message)
        return result("optimal", "bound", message, start, start_sim, objective=start_sim.energy_j, bound=lower_bound, gap=relative_gap(start_sim.energy_j, lower_bound))
    left_s = time_limit_s - (time.perf_counter() - started)
    if start is not None and left_s < MILP_MIN_LEFT_S and graph.n_nodes**2 >= NEIGHBOURHOOD_MIN_COLUMNS:
        gap = relative_gap(start_sim.energy_j, lower_bound)
        message = f"time limit of {time_limit_s:g} s reached before POET's MILP ({max(left_s, 0.0):.1f} s left, too little on {graph.n_nodes} nodes); returning the best start, gap {gap:.3%}"
        log.info(message)
        return result("time_limit", "bound", message, start, start_sim, objective=None, bound=lower_bound, gap=gap)
    model = model or build_milp(graph, costs, options)
    log.info("POET MILP: %d variables, %d constraints, %d nonzeros", model.n_cols, model.n_rows, model.A.nnz)
    if start is not None and not compression and not fits_milp(model, start):  # (DTR's frees, one stage late for the MILP)
        seeds = milp_seeds(graph, model, [(start, start_sim)], replay, charge_pagein)
        if seeds and seeds[0][1].energy_j <= start_sim.energy_j:
            start, start_sim = seeds[0]
    remaining_s = max(time_limit_s - (time.perf_counter() - started), min(1.0, time_limit_s / 4))  # the starts count against the limit
    answer = run_milp(
        model, solver=solver, time_limit_s=remaining_s, mip_gap=mip_gap, threads=threads, verbose=verbose,
        start=None if start is None else model.encode(start.matrices().as_dict()), lower_bound=lower_bound,
    )
    best_bound = max(answer.bound, lower_bound) if answer.bound is not None else lower_bound

    def start_result() -> SolveResult:
        log.info("the solver found nothing better than the start within its time limit; returning that")
        gap = relative_gap(start_sim.energy_j, best_bound)
        if gap <= mip_gap:
            return result("optimal", answer.solver, f"the start schedule is optimal within a relative gap of {mip_gap:g}", start, start_sim, objective=start_sim.energy_j, bound=best_bound, gap=gap)
        message = f"time limit of {time_limit_s:g} s reached; returning the start schedule, gap {gap:.3%}"
        return result("time_limit", answer.solver, message, start, start_sim, objective=None, bound=best_bound, gap=gap)

    if answer.x is None and start is not None and answer.status != "infeasible":
        return start_result()
    if answer.x is None:
        if answer.status == "infeasible":
            runtime = "" if runtime_budget_factor is None else f" within {runtime_budget_factor:g}x the plain-step runtime"
            forbidden = " or ".join(word for word, allowed in (("recomputation", remat), ("paging", paging)) if not allowed)
            message = (
                f"no schedule fits {int(ram_budget_bytes):,} bytes{runtime}{f' without {forbidden}' if forbidden else ''} "
                f"(the smallest single-node footprint is {footprint:,} bytes); raise the memory or runtime budget"
            )
        else:
            message = f"no schedule found within the {time_limit_s:g} s time limit; raise --time-limit"
        return result(answer.status, answer.solver, message, bound=best_bound)
    matrices = model.decode(answer.x)
    schedule = Schedule.from_matrices(graph, prefetch=charge_pagein, **matrices)
    try:
        sim = replay(schedule)
    except InvalidScheduleError as exc:
        raise PoetlabError(f"the {answer.solver} solution does not replay ({exc}); this is a poetlab bug, please report it") from exc
    if answer.status != "optimal" and start_sim is not None and sim.energy_j > start_sim.energy_j:
        return start_result()  # the solver did not keep the start (one it could not encode) as its incumbent
    if answer.objective is not None and not math.isclose(sim.energy_j, answer.objective, rel_tol=1e-6):
        log.warning("solver objective %.10g J and simulated energy %.10g J differ", answer.objective, sim.energy_j)
    gap = relative_gap(sim.energy_j, best_bound)
    status = "optimal" if gap is not None and gap <= mip_gap else answer.status
    message = {
        "optimal": f"optimal within a relative gap of {mip_gap:g}",
        "feasible": "feasible; the solver stopped before proving optimality",
        "time_limit": f"time limit of {time_limit_s:g} s reached; best schedule found, gap {gap:.3%}" if gap is not None else "time limit reached",
    }.get(status, status)
    return result(status, answer.solver, message, schedule, sim, objective=answer.objective, bound=best_bound, gap=gap)

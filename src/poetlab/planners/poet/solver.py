"""``poetlab.solve``: an energy-optimal schedule for a training graph under memory and runtime budgets.

The steps, each cheap before the expensive one:

1. Check the inputs (budgets, solver name, limits) and give a one-line error for bad ones.
2. A budget below the smallest single-node footprint (a node's output plus its inputs, all in RAM at
   once) is infeasible for every schedule: say so without building a MILP.
3. Every node must be computed at least once, so the energy of one plain step is a lower bound for
   every schedule. If checkpoint-all (no recomputation, no paging) fits the budgets, it meets that
   bound and is optimal: a certificate, with no MILP to solve.
4. Otherwise prove the eviction bound (:mod:`poetlab.planners.poet.bounds`); a quick schedule within the gap of it is
   optimal. Else (after the repair and the chain plans) the rebuild bound (:mod:`poetlab.planners.poet.rebuilds`) joins
   it and its point, made a schedule and chain-planned, the starts (where that schedule is over RAM between the bound's
   stages, the bound again with those: :mod:`poetlab.planners.poet.rebuild_rounds`); where the best start is near the bound and the bound's cover fills the runtime budget's slack with
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

Each step is one function below, with its gate and time share; what they share (the best start, the bound, the clock)
is one :class:`~poetlab.planners.poet.search_state.SearchState`, which also holds what a step does to it.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from poetlab.core.costs import CostModel, check_graph_and_costs
from poetlab.core.graph import TrainingGraph, min_footprint_bytes
from poetlab.core.schedule import InvalidScheduleError, Schedule, SimulationResult, checkpoint_all_schedule
from poetlab.errors import InvalidArgumentError, PoetlabError, UnknownNameError
from poetlab.planners.compression import compress_all_schedule
from poetlab.planners.poet.backends import SOLVERS, MilpSolution, relative_gap, run_milp
from poetlab.planners.poet.cpsat import cpsat_available
from poetlab.planners.poet.milp import MilpModel, MilpOptions, build_milp
from poetlab.planners.poet.neighbourhood import fits_milp, improve
from poetlab.planners.poet.primal import cover_fills_slack
from poetlab.planners.poet.repair import loose_starts
from poetlab.planners.poet.search_state import SearchState
from poetlab.planners.poet.starts import QUICK_STARTS, milp_seeds

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
#: the chain plans' share of the time limit and most seconds (about 0.2 s a start on bert/m4, NOTE 21)
CHAIN_SHARE, CHAIN_MAX_S = 0.05, 3.0
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
#: the fields of a :class:`SolveResult` read off the simulator's replay of its schedule (None without one)
_SIMULATED = (
    "energy_j", "compute_energy_j", "pagein_energy_j", "pageout_energy_j", "runtime_s", "peak_ram_bytes", "n_recomputes", "n_pageouts",
    "n_pageins", "compression_energy_j", "n_compresses",
)


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
    search = SearchState(graph, costs, options, ram_budget_bytes, runtime_budget_s, fixed, time_limit_s, mip_gap, started, lower_bound=costs.plain_step_energy_j)
    footprint, node = min_footprint_bytes(graph)
    settled = _below_footprint(search, footprint, node) or _checkpoint_all_fits(search)
    if settled is not None:
        return settled

    searching = bound == "eviction" and not compression  # (the phases before POET's MILP: steps 3-6 of docs/solve.md)
    search.begin(bound, starts, exclude_starts)
    _first_repair(search, searching, exclude_starts)
    if searching and options.remat and not search.proven():  # the chain's rebuilds re-planned (NOTE 21)
        search.chain_plans(min(CHAIN_SHARE * time_limit_s, CHAIN_MAX_S))
    if searching and not search.proven():  # the rebuilds' inputs charged (NOTE 23)
        search.rebuilds()
    _primal_phase(search)
    again_s = min(max(REPAIR_AGAIN_SHARE * time_limit_s, REPAIR_AGAIN_MIN_S), REPAIR_AGAIN_MAX_S, time_limit_s / 2)  # the second repair's share
    # (only where the interval relaxation makes schedules: with recomputation, page-ins not charged as they land)
    far_at_once = remat and not charge_pagein and search.start_sim is not None and search.start_gap() > INTERVAL_MIN_START_GAP
    _near_relaxation(search, searching, far_at_once, again_s)
    far = search.start_sim is not None and search.start_gap() > INTERVAL_MIN_START_GAP
    _far_relaxation(search, searching, far, far_at_once, again_s)
    _cpsat_phase(search, searching)
    _second_repair(search, searching, again_s)
    _near_after_far(search, searching, far)
    if searching:  # the relaxation's bound split at a cut vertex, from a 120 s limit (NOTE 34)
        search.split_bound()
    model = _window_search(search, searching)

    # the same problem again, smaller (the restrictions) or without compression, for a start
    resolve = partial(
        solve, graph, costs, ram_budget_bytes, runtime_budget_factor, count_paging_time=count_paging_time, charge_pagein=charge_pagein,
        params_in_budget=params_in_budget, solver=solver, mip_gap=mip_gap, threads=threads, verbose=verbose, bound=bound, exclude_starts=exclude_starts,
    )
    if compression and not search.proven():
        _compression_starts(search, resolve(paging=paging, remat=remat, time_limit_s=time_limit_s / 2, staged=staged, starts=starts))
    elif staged and paging and remat and time_limit_s >= STAGED_MIN_TIME_LIMIT_S and not search.proven():
        _staged_starts(search, resolve)
    return _without_milp(search) or _final_milp(search, model, footprint, solver, threads, verbose)


def _result(search: SearchState, status: str, solver_name: str, message: str, schedule=None, sim=None, objective=None, bound=None, gap=None) -> SolveResult:
    """The :class:`SolveResult` of ``search`` (its time taken so far), with ``sim``'s replay of ``schedule``."""
    return SolveResult(
        status=status, solver=solver_name, solve_time_s=time.perf_counter() - search.started, mip_gap=gap, objective_j=objective, bound_j=bound,
        ram_budget_bytes=float(search.ram_budget_bytes), runtime_budget_s=search.runtime_budget_s, message=message, schedule=schedule, simulation=sim,
        **{name: getattr(sim, name) if sim else None for name in _SIMULATED},
    )


def _below_footprint(search: SearchState, footprint: int, node: int) -> SolveResult | None:
    """Step 1: a budget below the smallest single-node footprint (plus what is kept free) fits no schedule."""
    graph, fixed = search.graph, search.fixed_bytes
    if footprint + fixed <= search.ram_budget_bytes:
        return None
    extra = f" plus {fixed:,} bytes kept free beside the tensors (parameters and gradients where asked, RNG states and shared-weight gradients: TrainingGraph.reserved_bytes)" if fixed else ""
    message = (
        f"the RAM budget {int(search.ram_budget_bytes):,} bytes is below the smallest single-node footprint "
        f"{footprint:,} bytes{extra} (node {graph.nodes[node].name} needs its inputs and output{' and workspace' if graph.workspace[node] else ''} in RAM at once)"
    )
    log.info(message)
    return _result(search, "infeasible", "bound", message)


def _checkpoint_all_fits(search: SearchState) -> SolveResult | None:
    """Step 2: checkpoint-all computes every node once, so where it fits it meets the trivial bound: optimal."""
    baseline = checkpoint_all_schedule(search.graph)
    try:
        sim = search.replay(baseline)
    except InvalidScheduleError:
        return None
    message = "checkpoint-all fits the budgets and meets the lower bound (every node computed once): optimal without a MILP"
    log.info(message)
    return _result(search, "optimal", "bound", message, baseline, sim, objective=sim.energy_j, bound=search.lower_bound, gap=0.0)


def _first_repair(search: SearchState, searching: bool, exclude_starts: Sequence[str]) -> None:
    """Step 3's repair (NOTE 6), from a 2 s limit, for 10% of it (1-6 s, at most half): the starts that did not replay,
    and DTR and greedy remat planned for the RAM budget alone, made to fit. Single changes only: the fitting starts'
    turn, with the ejection chains, comes after the relaxations, whose bounds need the time more (NOTE 9)."""
    time_limit_s = search.time_limit_s
    if searching and time_limit_s >= REPAIR_MIN_TIME_LIMIT_S and not search.proven():
        search.rejected[:0] = loose_starts(search.graph, search.costs, search.repair_budgets, exclude=exclude_starts)  # (the chain plans read them too)
        search.repair(search.rejected, min(max(REPAIR_SHARE * time_limit_s, REPAIR_MIN_S), REPAIR_MAX_S, time_limit_s / 2), chains=False)
        log.info("after the repair: %s", "no schedule" if search.start_sim is None else f"{search.start_sim.energy_j:.10g} J")
    search.repaired_before = len(search.rejected)


def _primal_phase(search: SearchState) -> None:
    """Step 4's primal phase (NOTE 18), from a 30 s limit: where the eviction cover's own schedule is near the bound (so
    the best start, no dearer, is too) and its recomputations fill the runtime budget's slack, the interval relaxation
    restricted to those recomputations looks for a start (15% of the limit, at most 8 s); it proves nothing."""
    options, cover, time_limit_s = search.options, search.cover, search.time_limit_s
    near_cover = "eviction cover" in search.quick and relative_gap(search.quick["eviction cover"], search.lower_bound) <= INTERVAL_MIN_START_GAP
    if (
        near_cover and cover is not None and cover.recompute is not None and cover_fills_slack(search.costs, options, cover.recompute)
        and not options.compression and options.remat and not options.charge_pagein and time_limit_s >= PRIMAL_MIN_TIME_LIMIT_S and not search.proven()
    ):
        search.cover_restricted(max(0.1, min(PRIMAL_SHARE * time_limit_s, PRIMAL_MAX_S, search.left_s())), max_columns=CPSAT_MAX_COLUMNS)


def _near_relaxation(search: SearchState, searching: bool, far_at_once: bool, again_s: float) -> None:
    """Step 4, from a 5 s limit, unless the best start is far above the bound already (``far_at_once``, NOTE 11): the
    interval relaxation from the best start (NOTE 13: half the limit, at most 16 s, less the second repair's share),
    or the stage relaxation (NOTE 3: 40%) where the interval relaxation makes no schedules or there is no start."""
    options, time_limit_s = search.options, search.time_limit_s
    if not (searching and time_limit_s >= RELAXATION_MIN_TIME_LIMIT_S and not far_at_once and not search.proven()):
        return
    remaining = search.left_s()
    if options.remat and not options.charge_pagein and search.start_sim is not None:
        search.from_best_start(max(0.1, min(NEAR_INTERVAL_SHARE * time_limit_s, NEAR_INTERVAL_MAX_S, remaining - again_s)))  # (the second repair keeps its share)
    else:
        search.stage_relaxation(max(0.1, min(RELAXATION_SHARE * time_limit_s, remaining)))


def _far_relaxation(search: SearchState, searching: bool, far: bool, far_at_once: bool, again_s: float) -> None:
    """Step 5, from a 5 s limit, where the best start is more than 5% above the bound (``far``): the interval relaxation
    (NOTE 5) at the budget and at the budget less a margin, whose schedules pay where the starts are far from a segment
    rebuild. At once (``far_at_once``) it takes the skipped step 4's share: half the limit, at most 30 s, less the second
    repair's share; after step 4, 40% (at most 30 s)."""
    time_limit_s = search.time_limit_s
    if not (searching and time_limit_s >= INTERVAL_MIN_TIME_LIMIT_S and far and not search.proven()):
        return
    remaining = search.left_s()
    if far_at_once:  # (the stage relaxation was skipped: its share, less what the second repair needs)
        share = min(INTERVAL_FAR_SHARE * time_limit_s, INTERVAL_MAX_S, remaining - again_s)
        log.info("the best start is %.1f%% above the bound: the interval relaxation first, for %.1f s (the stage relaxation skipped)", 100 * search.start_gap(), share)
    else:
        share = min(INTERVAL_SHARE * time_limit_s, INTERVAL_MAX_S, remaining)
    search.interval_relaxation(max(0.1, share))


def _cpsat_phase(search: SearchState, searching: bool) -> None:
    """Step 5's CP-SAT (NOTE 14), from a 30 s limit, where the relaxations raised the bound more than the gap above the
    eviction bound and the best start is within 5% of it, uncertified: the interval relaxation with all its rows from
    that start, for what is left less the second repair's least 2 s, stopped once its bound certifies the start."""
    options, time_limit_s = search.options, search.time_limit_s
    near = search.start_sim is not None and search.start_gap() <= INTERVAL_MIN_START_GAP  # (far: the repair's and the windows' turn)
    if not (
        searching and options.remat and not options.charge_pagein and near and time_limit_s >= CPSAT_MIN_TIME_LIMIT_S
        and search.lower_bound > search.evicted_j * (1 + search.mip_gap) and not search.proven()
    ):
        return
    available, why = cpsat_available()
    share = search.left_s() - REPAIR_AGAIN_MIN_S
    if not available:
        log.info("%s; CP-SAT skipped", why)
    elif share >= 1.0:
        log.info("CP-SAT on the interval relaxation from the best start for %.1f s (%s; the best start %.3f%% above the bound)", share, why, 100 * search.start_gap())
        search.cpsat(share, max_columns=CPSAT_MAX_COLUMNS)


def _second_repair(search: SearchState, searching: bool, again_s: float) -> None:
    """The second repair (NOTE 9), from a 5 s limit, for ``again_s`` (20% of the limit, 2-12 s, at most half): the
    relaxations' schedules over a budget made to fit, and every fitting start made cheaper, with the ejection chains."""
    if searching and search.time_limit_s >= REPAIR_AGAIN_MIN_TIME_LIMIT_S and not search.proven():
        search.repair(search.rejected[search.repaired_before:] + [schedule for schedule, _ in search.fitting], again_s, chains=True)


def _near_after_far(search: SearchState, searching: bool, far: bool) -> None:
    """NOTE 15: where the far path's schedules, repaired, brought the best start within 5% of the bound (uncertified),
    step 4's relaxation from it, for half the limit (at most 16 s, at most what is left less 1 s); skipped under 2 s or
    where step 5 found a solution below the bound (it could prove nothing). It stops once it has a solution below the
    bound; its schedule, over a budget, is repaired where it is not below the bound."""
    options, time_limit_s = search.options, search.time_limit_s
    if not (
        searching and far and options.remat and not options.charge_pagein and time_limit_s >= INTERVAL_MIN_TIME_LIMIT_S and not search.proven()
        and search.start_gap() <= INTERVAL_MIN_START_GAP
    ):
        return
    share = min(NEAR_INTERVAL_SHARE * time_limit_s, NEAR_INTERVAL_MAX_S, search.left_s() - REPAIR_MIN_S)
    if share < NEAR_AFTER_FAR_MIN_S or (search.relaxed_j is not None and search.relaxed_j < search.lower_bound):
        log.info("the best start is %.2f%% above the bound after the far path: the interval relaxation from it skipped (%s)", 100 * search.start_gap(), f"{share + REPAIR_MIN_S:.1f} s left" if share < NEAR_AFTER_FAR_MIN_S else "it has a solution below the bound")
        return
    log.info("the best start is %.2f%% above the bound after the far path: the interval relaxation from it, for %.1f s", 100 * search.start_gap(), share)
    unrepaired, floor_j = len(search.rejected), search.lower_bound
    incumbent_j = search.from_best_start(share, floor_j=floor_j)
    if search.rejected[unrepaired:] and not search.proven() and incumbent_j is not None and incumbent_j >= floor_j:  # its schedule, over a budget (one below the bound cannot fit)
        search.repair(search.rejected[unrepaired:], REPAIR_AGAIN_MAX_S, chains=True)


def _window_search(search: SearchState, searching: bool) -> MilpModel | None:
    """Step 6 (NOTE 4), from a 5 s limit, on a MILP of 10,000 columns or more: POET's MILP re-solved a few tensors at a
    time from the starts that are its solutions, for up to 60% of the limit, stopped once a schedule certifies. Returns
    the MILP where it was built (POET's MILP reuses it)."""
    time_limit_s = search.time_limit_s
    model = None
    if searching and time_limit_s >= NEIGHBOURHOOD_MIN_TIME_LIMIT_S and not search.proven():
        model = build_milp(search.graph, search.costs, search.options)
    if model is not None and model.n_cols >= NEIGHBOURHOOD_MIN_COLUMNS:
        remaining = search.left_s()
        seeds = milp_seeds(search.graph, model, search.fitting, search.replay, search.options.charge_pagein)
        if not seeds:
            log.info("window search skipped: no start is a solution of POET's MILP")
        elif remaining > 1.0:
            found = improve(
                search.graph, model, seeds, search.replay, time_limit_s=min(NEIGHBOURHOOD_SHARE * time_limit_s, remaining),
                target_j=search.lower_bound / (1 - search.mip_gap), prefetch=search.options.charge_pagein,
            )
            search.take("window search", found[0], collect=False, reject=False)
    return model


def _compression_starts(search: SearchState, plain: SolveResult) -> None:
    """With compression: POET without it (``plain``, half the limit) and BitTrain's policy (every step computed once,
    every allowed output compressed while idle) start the larger problem, so its answer is never worse than either."""
    log.info("staged: POET without compression gives %s (%s)", plain.energy_j, plain.status)
    search.keep(plain.schedule, plain.simulation)
    try:
        bittrain_sim = search.replay(bittrain := compress_all_schedule(search.graph, search.costs.compression))
    except InvalidScheduleError:
        bittrain_sim = None
    if search.keep(bittrain, bittrain_sim):
        log.info("compress-all start: %.10g J", bittrain_sim.energy_j)


def _staged_starts(search: SearchState, resolve: Callable[..., SolveResult]) -> None:
    """Step 7's restrictions (``staged``, from a 10 s limit): remat only, then paging only, a quarter of the limit each
    (less where steps 4-6 left less than three quarters; skipped under 1 s or once a start certifies); the cheaper
    schedule starts POET's MILP, which is then never worse than either restriction."""
    for label, flags in (("remat only", {"paging": False}), ("paging only", {"remat": False})):
        share = min(search.time_limit_s / 4, search.left_s() / 3)
        if search.proven() or share < 1.0:
            break
        restricted = resolve(time_limit_s=share, **flags)
        found = f"{restricted.energy_j:.10g} J" if restricted.energy_j is not None else "no schedule"
        log.info("staged: %s gives %s (%s)", label, found, restricted.status)
        search.keep(restricted.schedule, restricted.simulation)


def _without_milp(search: SearchState) -> SolveResult | None:
    """The answer without POET's MILP: the best start where it certifies, or where too little time is left for the MILP
    on a graph of 100 nodes or more (``MILP_MIN_LEFT_S``: HiGHS could not read and presolve it in time)."""
    if search.proven():
        message = f"the best start meets the lower bound within the gap {search.mip_gap:g}: optimal without a MILP solve"
        log.info(message)
        return _result(search, "optimal", "bound", message, search.start, search.start_sim, objective=search.start_sim.energy_j, bound=search.lower_bound, gap=search.start_gap())
    left_s = search.time_limit_s - (time.perf_counter() - search.started)
    if search.start is not None and left_s < MILP_MIN_LEFT_S and search.graph.n_nodes**2 >= NEIGHBOURHOOD_MIN_COLUMNS:
        gap = search.start_gap()
        message = f"time limit of {search.time_limit_s:g} s reached before POET's MILP ({max(left_s, 0.0):.1f} s left, too little on {search.graph.n_nodes} nodes); returning the best start, gap {gap:.3%}"
        log.info(message)
        return _result(search, "time_limit", "bound", message, search.start, search.start_sim, objective=None, bound=search.lower_bound, gap=gap)
    return None


def _final_milp(search: SearchState, model: MilpModel | None, footprint: int, solver: str, threads: int | None, verbose: bool) -> SolveResult:
    """Step 7's end: POET's MILP for what is left of the limit (at least min(1 s, a quarter)), from the best start in its
    MILP form (DTR's frees come one stage late for the MILP, NOTE 4), with the lower bound given to stop at a certificate."""
    graph, options, time_limit_s = search.graph, search.options, search.time_limit_s
    model = model or build_milp(graph, search.costs, options)
    log.info("POET MILP: %d variables, %d constraints, %d nonzeros", model.n_cols, model.n_rows, model.A.nnz)
    if search.start is not None and not options.compression and not fits_milp(model, search.start):
        seeds = milp_seeds(graph, model, [(search.start, search.start_sim)], search.replay, options.charge_pagein)
        if seeds and seeds[0][1].energy_j <= search.start_sim.energy_j:
            search.start, search.start_sim = seeds[0]
    remaining_s = max(time_limit_s - (time.perf_counter() - search.started), min(1.0, time_limit_s / 4))  # the starts count against the limit
    answer = run_milp(
        model, solver=solver, time_limit_s=remaining_s, mip_gap=search.mip_gap, threads=threads, verbose=verbose,
        start=None if search.start is None else model.encode(search.start.matrices().as_dict()), lower_bound=search.lower_bound,
    )
    best_bound = max(answer.bound, search.lower_bound) if answer.bound is not None else search.lower_bound
    if answer.x is None and search.start is not None and answer.status != "infeasible":
        return _start_result(search, answer, best_bound)
    if answer.x is None:
        return _no_schedule(search, answer, best_bound, footprint)
    schedule = Schedule.from_matrices(graph, prefetch=options.charge_pagein, **model.decode(answer.x))
    try:
        sim = search.replay(schedule)
    except InvalidScheduleError as exc:
        raise PoetlabError(f"the {answer.solver} solution does not replay ({exc}); this is a poetlab bug, please report it") from exc
    if answer.status != "optimal" and search.start_sim is not None and sim.energy_j > search.start_sim.energy_j:
        return _start_result(search, answer, best_bound)  # the solver did not keep the start (one it could not encode) as its incumbent
    if answer.objective is not None and not math.isclose(sim.energy_j, answer.objective, rel_tol=1e-6):
        log.warning("solver objective %.10g J and simulated energy %.10g J differ", answer.objective, sim.energy_j)
    gap = relative_gap(sim.energy_j, best_bound)
    status = "optimal" if gap is not None and gap <= search.mip_gap else answer.status
    message = {
        "optimal": f"optimal within a relative gap of {search.mip_gap:g}",
        "feasible": "feasible; the solver stopped before proving optimality",
        "time_limit": f"time limit of {time_limit_s:g} s reached; best schedule found, gap {gap:.3%}" if gap is not None else "time limit reached",
    }.get(status, status)
    return _result(search, status, answer.solver, message, schedule, sim, objective=answer.objective, bound=best_bound, gap=gap)


def _start_result(search: SearchState, answer: MilpSolution, best_bound: float) -> SolveResult:
    """The best start as the answer, where the MILP found nothing better: optimal where it is within the gap of the bound."""
    log.info("the solver found nothing better than the start within its time limit; returning that")
    gap = relative_gap(search.start_sim.energy_j, best_bound)
    if gap <= search.mip_gap:
        return _result(search, "optimal", answer.solver, f"the start schedule is optimal within a relative gap of {search.mip_gap:g}", search.start, search.start_sim, objective=search.start_sim.energy_j, bound=best_bound, gap=gap)
    message = f"time limit of {search.time_limit_s:g} s reached; returning the start schedule, gap {gap:.3%}"
    return _result(search, "time_limit", answer.solver, message, search.start, search.start_sim, objective=None, bound=best_bound, gap=gap)


def _no_schedule(search: SearchState, answer: MilpSolution, best_bound: float, footprint: int) -> SolveResult:
    """The MILP's answer without a schedule (and no start): infeasible, with what to raise, or out of time."""
    options = search.options
    if answer.status == "infeasible":
        factor = options.runtime_budget_factor
        runtime = "" if factor is None else f" within {factor:g}x the plain-step runtime"
        forbidden = " or ".join(word for word, allowed in (("recomputation", options.remat), ("paging", options.paging)) if not allowed)
        message = (
            f"no schedule fits {int(search.ram_budget_bytes):,} bytes{runtime}{f' without {forbidden}' if forbidden else ''} "
            f"(the smallest single-node footprint is {footprint:,} bytes); raise the memory or runtime budget"
        )
    else:
        message = f"no schedule found within the {search.time_limit_s:g} s time limit; raise --time-limit"
    return _result(search, answer.status, answer.solver, message, bound=best_bound)

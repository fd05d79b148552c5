"""What one :func:`poetlab.planners.poet.solver.solve` carries from phase to phase (docs/solve.md, the solve flow).

Each phase before POET's MILP reads the same few things and may change two of them: the best start (the cheapest
schedule that replays within the budgets so far, with its simulation) and the proven lower bound. A phase ends the
search early where the best start is within the gap of the bound (:meth:`SearchState.proven`), and takes its time
from one clock (:meth:`SearchState.left_s`), so the state is one object rather than variables shared by closures:
a phase is then a plain function of it, whose gate and time share can be read on their own.

The solver (:mod:`poetlab.planners.poet.solver`) decides which phase runs and for how long: its gates and time
shares, with their constants, are the solve flow. This module holds what a phase does to the state once it runs:
replaying a schedule within the budgets, keeping the cheaper of the best start and a new schedule, the eviction
bound and the quick starts, repairing a batch of schedules (:mod:`poetlab.planners.poet.repair`), and each
relaxation's bound and schedules joining the state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import InvalidScheduleError, Schedule, SimulationResult, simulate
from poetlab.planners.poet.backends import relative_gap
from poetlab.planners.poet.bounds import CoverProblem, EvictionCover, cover_problem, evict_schedule, eviction_cover
from poetlab.planners.poet.chain import chain_plan
from poetlab.planners.poet.coherence import coherent_schedule
from poetlab.planners.poet.cpsat import interval_bound_cpsat
from poetlab.planners.poet.intervals import interval_bound, interval_start
from poetlab.planners.poet.lagrange import split_bound
from poetlab.planners.poet.milp import MilpOptions
from poetlab.planners.poet.primal import cover_restricted
from poetlab.planners.poet.rebuild_rounds import point_schedule, rounds, worst_stages
from poetlab.planners.poet.rebuilds import RebuildBound, default_stages, rebuild_bound, tight_stages
from poetlab.planners.poet.relaxation import stage_relaxation
from poetlab.planners.poet.repair import Budgets as RepairBudgets, repair_all
from poetlab.planners.poet.starts import best_start, better

log = logging.getLogger("poetlab.poet_solver")  # (the solver's logger: these are steps of its log)

#: the rebuild bound (NOTE 23) gets this share of the limit, at least and at most these many seconds (stopped, its dual
#: bound stands): 0.2-0.6 s to its optimum on bert_seq8/m4 at 0 and 0.5; 3 s cost bert/m4/0/2x and resnet18_cifar/m4/0/2x
#: time they needed and proved nothing there
REBUILD_SHARE, REBUILD_MIN_S, REBUILD_MAX_S = 0.05, 0.5, 1.0
#: with a limit of this many seconds or more, each rebuild bound gets up to ``REBUILD_LONG_MAX_S`` instead: the tight
#: stages' bound on resnet50/m4/0/2x, 0.6 s on an idle machine, stopped at 1.2 s at load 5-6 (NOTE 35) short of its
#: optimum, and the settled point, gated on it, did not run (the row ended 18% above its bound instead of certified)
REBUILD_LONG_LIMIT_S, REBUILD_LONG_MAX_S = 120.0, 3.0
#: the rebuild bound at the stages of least room (NOTE 28) as well only with a limit of this many seconds or more: each
#: bound takes its 0.5 s least, and at `--time-limit 1` both made resnet50's solve 3.3 s of wall time (issue 28: 4 s at most)
TIGHT_MIN_LIMIT_S = 5.0
#: the tight stages' bound gets this share of the limit, at most these many seconds, where the best start is within
#: this share of the bound (NOTE 36): resnet50/m4/0.1 (grid) proves it in 0.8 s (1.05x), 2 s (1.5x) alone, 2.5-2.9 s at load 4
TIGHT_SHARE, TIGHT_MAX_S, TIGHT_NEAR = 0.05, 3.0, 0.05
#: the rounds that add the stages a point's schedule is over RAM at (NOTE 27) get this share of the limit, at most
#: these many seconds: 1.0-1.3 s for bert_seq8/m4/0/2x's second round (24 stages), 5.3 s for resnet18_cifar/m4/0.2/1.2x's
#: second and third
ROUNDS_SHARE, ROUNDS_MAX_S = 0.1, 6.0
#: the settled point's schedule (NOTE 29), over a budget, is repaired alone for this share of the limit, at least and at
#: most these many seconds (single changes, so it stops at their local optimum: 0.4 s on resnet50/jetsontx2/0/2x)
SETTLED_REPAIR_SHARE, SETTLED_REPAIR_MIN_S, SETTLED_REPAIR_MAX_S = 0.05, 0.5, 3.0
#: where the settled point's schedule (as NOTE 29 has it) is over RAM and nothing certifies, the rebuild bound again at
#: its stages with the ``WORST_STAGES`` stages most bytes over added (NOTE 32), for this share of the limit, at most these
#: many seconds, only with a limit of ``WORST_MIN_LIMIT_S`` or more: resnet50/m4/0/2x 1.092435 -> 1.099257 (5 s, optimal;
#: 16 stages, the block 163 tensors), its settled point repaired 1.103312
WORST_STAGES, WORST_SHARE, WORST_MAX_S, WORST_MIN_LIMIT_S = 4, 1 / 6, 10.0, 30.0
#: the settled point's schedule is repaired, and its worst stages bound again, only where it is within this share of
#: its bound before the RAM check (resnet50/m4/0/2x 3.1%, resnet50/jetsontx2/0/2x 0.02%); on bert/m4/0/2x it is 14%
#: above, over RAM at 4 stages, and the repair and the bound at its stages took 6 s of the row's 60 for nothing
SETTLED_NEAR = 0.05
#: the split bound (NOTE 34: the interval relaxation split at a cut vertex, priced, in buckets) only with a limit of this
#: many seconds or more, where the best start is within ``SPLIT_NEAR`` of the bound and the interval relaxation raised the
#: bound (it is the relaxation's bound that stalls), and at least ``SPLIT_MIN_LEFT_S`` are left; it takes what is left less
#: ``SPLIT_RESERVE_SHARE`` of the limit (at least ``SPLIT_RESERVE_S``) for the window search that follows. On
#: resnet18_cifar/m4/0/2x it proves 1.368197-1.368225 in 34-90 s of one thread (NOTE 26, 30, 34): no 60 s limit has
#: that time beside the schedule's 46-60 s
SPLIT_MIN_LIMIT_S, SPLIT_NEAR, SPLIT_MIN_LEFT_S, SPLIT_RESERVE_SHARE, SPLIT_RESERVE_S = 120.0, 0.05, 60.0, 0.2, 30.0
#: and only on a relaxation of at most this many columns (resnet18_cifar/m4/0/2x: 13,130; CP-SAT's limit, resnet50 at its
#: smallest footprints is over it)
SPLIT_MAX_COLUMNS = 50_000


@dataclass
class SearchState:
    """One solve's problem (fixed) and its search so far (changed by the phases).

    ``ram_budget_bytes`` is the budget as the caller gave it (the simulator's check); ``fixed_bytes`` what is
    kept free beside the tensors; ``started`` the ``time.perf_counter()`` the time limit counts from.
    ``lower_bound`` is the best proven bound (J), ``evicted_j`` the eviction and rebuild bounds (CP-SAT runs only
    where a relaxation raised the bound above it). ``fitting`` holds every schedule that replayed within the
    budgets, ``rejected`` every one that did not (the repairs' input; ``repaired_before``: how many of them the
    first repair saw), ``quick`` each quick start's least energy by name. ``relaxed_j`` is the far path's
    interval relaxation's optimum where it found one (NOTE 15).
    """

    graph: TrainingGraph
    costs: CostModel
    options: MilpOptions
    ram_budget_bytes: float
    runtime_budget_s: float | None
    fixed_bytes: int
    time_limit_s: float
    mip_gap: float
    started: float
    lower_bound: float
    evicted_j: float = 0.0
    cover: EvictionCover | None = None
    start: Schedule | None = None
    start_sim: SimulationResult | None = None
    fitting: list[tuple[Schedule, SimulationResult]] = field(default_factory=list)
    rejected: list[Schedule] = field(default_factory=list)
    quick: dict[str, float] = field(default_factory=dict)
    repaired_before: int = 0
    relaxed_j: float | None = None

    @property
    def repair_budgets(self) -> RepairBudgets:
        """The budgets in the repair's terms."""
        options = self.options
        return RepairBudgets(
            float(self.ram_budget_bytes), self.runtime_budget_s, self.fixed_bytes, options.count_paging_time,
            options.charge_pagein, options.paging, options.remat,
        )

    def replay(self, schedule: Schedule) -> SimulationResult:
        """The simulator's replay of ``schedule`` within the budgets (raises ``InvalidScheduleError`` over one)."""
        return simulate(
            schedule, self.graph, self.costs, ram_budget_bytes=self.ram_budget_bytes, runtime_budget_s=self.runtime_budget_s,
            count_paging_time=self.options.count_paging_time, fixed_bytes=self.fixed_bytes,
        )

    def left_s(self) -> float:
        """Seconds left of the time limit (negative past it); one clock read."""
        return self.started + self.time_limit_s - time.perf_counter()

    def start_gap(self) -> float:
        """The best start's relative gap to the lower bound (there must be a best start)."""
        return relative_gap(self.start_sim.energy_j, self.lower_bound)

    def proven(self) -> bool:
        """Whether the best start is within the gap of the lower bound: nothing left to solve."""
        return self.start_sim is not None and relative_gap(self.start_sim.energy_j, self.lower_bound) <= self.mip_gap

    def certifying_j(self) -> float:
        """The bound at which the best start is within the gap: a relaxation's target."""
        return self.start_sim.energy_j * (1 - self.mip_gap) * (1 + 1e-9)

    def keep(self, schedule: Schedule | None, sim: SimulationResult | None) -> bool:
        """Keep an already replayed ``schedule`` as the best start if it is cheaper; whether it was."""
        if sim is not None and (self.start_sim is None or sim.energy_j < self.start_sim.energy_j):
            self.start, self.start_sim = schedule, sim
            return True
        return False

    def take(self, name: str, schedule: Schedule | None, collect: bool = True, reject: bool = True) -> None:
        """Replay ``schedule`` (logged as ``name``) and keep it as the best start if it fits and is cheaper; it joins
        ``fitting`` (``collect``) or ``rejected`` (``reject``) for the repairs and the window search."""
        self.start, self.start_sim = better(
            (self.start, self.start_sim), name, schedule, self.replay,
            collect=self.fitting if collect else None, rejected=self.rejected if reject else None,
        )

    def repair(self, schedules: list[Schedule], share_s: float, chains: bool) -> None:
        """Repair ``schedules`` (:func:`~poetlab.planners.poet.repair.repair_all`) for ``share_s`` at most (never past
        the time limit); each result is replayed and kept where it is cheaper than the best start."""
        best = (self.start, self.start_sim)
        for schedule in repair_all(self.graph, self.costs, schedules, self.repair_budgets, time_limit_s=min(share_s, self.left_s()), chains=chains):
            best = better(best, "repaired", schedule, self.replay, collect=self.fitting)
        self.start, self.start_sim = best

    def chain_plans(self, share_s: float) -> None:
        """Each fitting start, cheapest first, then each that did not fit (the plan reads only their RAM profile: greedy
        remat's, over the runtime budget at 1.05x, gives bert/m4/0.5's certified plan), with its backward pass's rebuilds
        of the forward chain re-planned (:func:`~poetlab.planners.poet.chain.chain_plan`, NOTE 21) for ``share_s`` in all;
        each plan replayed, kept where it fits (and as the best start where it is cheaper), until one certifies."""
        deadline = min(time.perf_counter() + share_s, self.started + self.time_limit_s)
        fitting = [schedule for schedule, _ in sorted(self.fitting, key=lambda pair: pair[1].energy_j)]
        for schedule in fitting + self.rejected:
            left = deadline - time.perf_counter()
            if left <= 0 or self.proven():
                break
            planned = chain_plan(self.graph, self.costs, self.ram_budget_bytes, schedule, self.fixed_bytes, time_limit_s=left)
            if planned is not None:
                self.take("chain plan", planned, reject=False)
        log.info("after the chain plans: %s", "no schedule" if self.start_sim is None else f"{self.start_sim.energy_j:.10g} J")

    def from_best_start(self, share_s: float, floor_j: float | None = None) -> float | None:
        """NOTE 13's interval relaxation from the best start for ``share_s`` (stopped once its bound certifies the
        start, or with ``floor_j`` once it has a solution below that: NOTE 15). Its bound joins the lower bound and
        its schedule the starts; returns its incumbent in J (None without one)."""
        warm = interval_bound(
            self.graph, self.costs, self.options, time_limit_s=share_s, mip_gap=self.mip_gap / 2, kept_rows=False,
            start=self.start, target_j=self.certifying_j(), floor_j=floor_j,
        )
        plain_j = self.costs.plain_step_energy_j
        self.lower_bound = max(self.lower_bound, warm.bound_j)
        log.info(
            "lower bound after the interval relaxation from the best start: %.10g J (%.6f x one plain step, %s, %.1f s)",
            self.lower_bound, self.lower_bound / plain_j, "optimal" if warm.optimal else "stopped", warm.seconds,
        )
        self.take("interval relaxation from the best start", warm.schedule)
        return None if warm.incumbent is None else warm.incumbent * plain_j

    def begin(self, bound: str, starts: Sequence[Schedule], exclude_starts: Sequence[str]) -> None:
        """The eviction bound (``bound="eviction"``: at most min(10 s, 10% of the limit), NOTE 2), then the quick starts
        (:func:`~poetlab.planners.poet.starts.best_start`, the bound's covers for min(2 s, 5%)) and the caller's
        ``starts``, replayed: the best that fits is the start every later phase improves on."""
        graph, costs, options, time_limit_s = self.graph, self.costs, self.options, self.time_limit_s
        if bound == "eviction":
            self.cover = eviction_cover(graph, costs, options, time_limit_s=min(10.0, 0.1 * time_limit_s))
            self.lower_bound = max(self.lower_bound, self.cover.bound_j)
        log.info("lower bound: %.10g J (%.6f x one plain step)", self.lower_bound, self.lower_bound / costs.plain_step_energy_j)
        self.start, self.start_sim = best_start(
            graph, costs, options, self.runtime_budget_s, self.replay, covers_s=min(2.0, 0.05 * time_limit_s) if bound == "eviction" else 0.0,
            deadline=self.started + time_limit_s, exclude=exclude_starts, collect=self.fitting, rejected=self.rejected, energies=self.quick,
        )
        for given in starts:
            try:
                given_sim = self.replay(given)
            except InvalidScheduleError as exc:
                log.info("a given start does not fit the budgets (%s); ignoring it", exc.reason)
                continue
            self.fitting.append((given, given_sim))
            self.keep(given, given_sim)
        self.evicted_j = self.lower_bound

    def rebuilds(self) -> None:
        """The rebuild bound (NOTE 23: the eviction bound with a rebuild's inputs charged at the backward pass's stages)
        at its default stages and, with a limit of 5 s or more, at the tight ones (NOTE 28), each for 5% of the limit
        (0.5-1 s; up to 3 s from a 120 s limit, NOTE 35; the tight ones more where the best start is near:
        :meth:`tight_limit_s`); the better joins the eviction bound (``evicted_j`` too: the bound the relaxations must
        raise). Its
        point made schedules joins the starts: each tensor it regenerates evicted over its longest idle interval, with recomputation its chain
        re-planned (NOTE 21), and the point followed interval by interval (NOTE 27; one over a budget is dropped: it did
        not pay in the second repair, whose time it shared, on bert/m4/0/2x). Where that bound was solved and nothing
        certifies, the bound again with the stages the point's schedule is over RAM at
        (:func:`~poetlab.planners.poet.rebuild_rounds.rounds`, 10% of the limit, at most 6 s). Then, with a limit of 5 s
        or more, where that bound's point is within the gap of it and nothing certifies, the point settled
        (:meth:`settled_point`, NOTE 29)."""
        graph, costs = self.graph, self.costs
        problem = None if self.options.compression else cover_problem(graph, costs, self.options)
        if problem is None:  # (no stage over budget, or compression: the rebuild bound proves nothing)
            return
        most_s = REBUILD_LONG_MAX_S if self.time_limit_s >= REBUILD_LONG_LIMIT_S else REBUILD_MAX_S
        limit_s = min(most_s, max(REBUILD_MIN_S, REBUILD_SHARE * self.time_limit_s))
        # (from the stage most over budget, and at the stages with the least room: NOTE 28; the better one's point)
        found = [rebuild_bound(graph, costs, self.options, limit_s, default_stages, problem)]
        tight_s = self.tight_limit_s(limit_s) if self.time_limit_s >= TIGHT_MIN_LIMIT_S else 0.0
        if tight_s > 0:
            found.append(rebuild_bound(graph, costs, self.options, tight_s, tight_stages, problem))
        rebuilt = max(found, key=lambda bound: bound.bound_j)
        self.lower_bound = max(self.lower_bound, rebuilt.bound_j)
        self.evicted_j = max(self.evicted_j, rebuilt.bound_j)
        if rebuilt.recompute is None or self.options.charge_pagein:
            return
        seed = evict_schedule(graph, rebuilt.recompute, rebuilt.page)
        self.take("rebuild bound's point", seed)
        if self.options.remat and not self.proven():
            planned = chain_plan(graph, costs, self.ram_budget_bytes, seed, self.fixed_bytes, time_limit_s=max(0.1, min(REBUILD_MAX_S, self.left_s())))
            if planned is not None:
                self.take("chain plan of the rebuild bound's point", planned, reject=False)
        self.take("rebuild bound's point by intervals", point_schedule(graph, rebuilt, self.options.remat), reject=False)
        self.rebuild_rounds(rebuilt, problem)
        near = rebuilt.optimal or (rebuilt.point_j is not None and rebuilt.point_j <= rebuilt.bound_j * (1 + self.mip_gap))
        if rebuilt is not found[0] and tight_s > limit_s:  # (given more time, only a proven point: NOTE 36, Fig. 4's resnet18)
            near = rebuilt.optimal
        if near and self.time_limit_s >= TIGHT_MIN_LIMIT_S and not self.proven():  # (a point far from its bound: bert/m4/0/2x's, 1.2% at 1 s)
            worst = self.settled_point(rebuilt)
            self.worst_stages_bound(rebuilt, problem, worst)

    def tight_limit_s(self, limit_s: float) -> float:
        """The tight stages' rebuild bound's time (NOTE 36): ``limit_s``, as the default stages', but where the best start
        is within ``TIGHT_NEAR`` of the bound (where the settled point, which runs only from a point proven or near its
        bound, can certify), ``TIGHT_SHARE`` of the limit, at most ``TIGHT_MAX_S``. On the grid's resnet50/m4/0.1 that
        bound is proven in 0.8 s (1.05x) and about 2 s (1.5x) alone, and stopped at 1 s under load: no settled point, the
        row open. Fig. 3's bert/m4/0/2x, whose bound stops at its cap anyway, keeps 1 s: its start is 24% above. Given
        more time, the bound's point leads to the settled point only where it is proven: stopped at 3 s within the gap on
        Fig. 4's resnet18/m4/0.2 (start 0.8% above), the settled point and its worst stages' bound took 13 s for nothing."""
        if self.start_sim is None or self.start_gap() > TIGHT_NEAR:
            return limit_s
        return max(limit_s, min(TIGHT_MAX_S, TIGHT_SHARE * self.time_limit_s))

    def worst_stages_bound(self, rebuilt: RebuildBound, problem: CoverProblem, worst: list[int]) -> None:
        """NOTE 32: where nothing certifies after the settled point and its schedule was over RAM, the rebuild bound at
        ``rebuilt``'s stages and the ``worst`` ones (the stages that schedule was most bytes over; valid at any stages,
        NOTE 23), for a sixth of the limit (at most 10 s, from a 30 s limit): its bound joins the lower bound, and where
        its point is within the gap of it, the point settled joins the starts (:meth:`settled_point`). The rounds
        (NOTE 27) add only stages after t_1; on resnet50/m4/0/2x the settled schedule is over RAM in the forward pass and
        the first backward layers, before the tight stages."""
        share_s = min(WORST_MAX_S, WORST_SHARE * self.time_limit_s, self.left_s())
        added = [t for t in worst if t not in rebuilt.stages]
        if self.proven() or not added or self.time_limit_s < WORST_MIN_LIMIT_S or share_s < 1.0:
            return
        bound = rebuild_bound(self.graph, self.costs, self.options, share_s, sorted({*rebuilt.stages, *added}), problem)
        self.lower_bound = max(self.lower_bound, bound.bound_j)
        self.evicted_j = max(self.evicted_j, bound.bound_j)
        log.info("rebuild bound with the stages the settled point's schedule is most over RAM at: %.6f x one plain step", bound.bound_j / self.costs.plain_step_energy_j)
        if bound.point_j is not None and bound.point_j <= bound.bound_j * (1 + self.mip_gap) and not self.proven():
            self.settled_point(bound)

    def rebuild_rounds(self, rebuilt: RebuildBound, problem: CoverProblem) -> None:
        """NOTE 27's rounds from ``rebuilt`` (solved on ``problem``), where nothing certifies yet: each round's bound joins
        the lower bound and its point's schedule the starts, until one certifies (10% of the limit, at most 6 s)."""
        share_s = min(ROUNDS_MAX_S, ROUNDS_SHARE * self.time_limit_s, self.left_s())
        if self.proven() or share_s <= 0:
            return
        for bound, schedule in rounds(self.graph, self.costs, self.options, rebuilt, self.ram_budget_bytes - self.fixed_bytes, share_s, problem):
            self.lower_bound = max(self.lower_bound, bound.bound_j)
            self.evicted_j = max(self.evicted_j, bound.bound_j)
            log.info("rebuild bound with the stages its point's schedule is over RAM at: %.6f x one plain step", bound.bound_j / self.costs.plain_step_energy_j)
            self.take("rebuild bound's point by intervals", schedule, reject=False)
            if self.proven():
                return

    def settled_point(self, rebuilt: RebuildBound) -> list[int]:
        """NOTE 29: the point of a rebuild bound solved to optimality or stopped within the gap of it followed interval by
        interval with its block's early evictions and adjacent holds settled (``point_schedule(..., settled=True)``), its
        reruns of paged-out tensors made page-ins and its repeated reruns held
        (:func:`~poetlab.planners.poet.coherence.coherent_schedule`); it joins the starts, and where it is over a budget
        but, RAM aside, cheaper than the best start, it is repaired alone with single changes (5% of the limit, 0.5-3 s:
        0.2-0.4 s on resnet50/jetsontx2/0/2x, from 2-6 stages over RAM to 1.003857-1.003970 plain steps, which certify).
        Twice (NOTE 32): as NOTE 29 had it, and with the tensors the point holds across t_1 out of RAM in the forward
        pass (``forward_out``), which fits resnet50/m4/0/2x as it is (1.12 plain steps; the first way is over RAM at
        16 stages, at 39 as NOTE 29 had it) and on resnet50/jetsontx2/0/2x repairs to 1.004012 instead of 1.003970.
        Only a schedule within ``SETTLED_NEAR`` of the bound (RAM aside) is repaired or has its worst stages returned, and
        the second way is made only where the first is that near and differs from it.
        Returns the ``WORST_STAGES`` stages the first way's schedule is most bytes over (none where it fits or is far)."""
        unfit: list[Schedule] = []
        worst: list[int] = []
        points: list[Schedule] = []
        for forward_out in (False, True):  # (NOTE 32: out in the forward pass too fits resnet50/m4/0/2x, costs jetsontx2 4e-5)
            point = point_schedule(self.graph, rebuilt, self.options.remat, settled=True, forward_out=forward_out)
            if point is None or self.proven():
                return worst
            if point in points:  # (nothing held across t_1 to take out)
                break
            points.append(point)
            schedule = coherent_schedule(self.graph, self.costs, point, self.ram_budget_bytes - self.fixed_bytes)
            unbudgeted_j = simulate(schedule, self.graph, self.costs).energy_j
            near = unbudgeted_j <= rebuilt.bound_j * (1 + SETTLED_NEAR)
            if not forward_out and near:
                worst = worst_stages(self.graph, schedule, self.ram_budget_bytes - self.fixed_bytes, WORST_STAGES)
            rejected: list[Schedule] = []
            self.start, self.start_sim = better((self.start, self.start_sim), "rebuild bound's point settled", schedule, self.replay, collect=self.fitting, rejected=rejected)
            if rejected and near and (self.start_sim is None or unbudgeted_j < self.start_sim.energy_j):
                unfit += rejected
            if not near:  # (the second way moves only what the point holds across t_1: as far; bert/m4/0/2x's both 1.324)
                break
        share_s = min(SETTLED_REPAIR_MAX_S, max(SETTLED_REPAIR_MIN_S, SETTLED_REPAIR_SHARE * self.time_limit_s), self.left_s())
        if unfit and not self.proven() and share_s > 0:
            self.repair(unfit, share_s, chains=False)
        return worst

    def cover_restricted(self, share_s: float, max_columns: int) -> None:
        """The interval relaxation restricted to the eviction cover's recomputations (NOTE 18) for ``share_s``, stopped
        once its solution certifies: its schedule joins the starts (it proves nothing)."""
        found = cover_restricted(
            self.graph, self.costs, self.options, self.cover.recompute, time_limit_s=share_s, floor_j=self.lower_bound / (1 - self.mip_gap),
            mip_gap=self.mip_gap / 2, max_columns=max_columns,
        )
        self.take("cover-restricted relaxation", found.schedule)

    def stage_relaxation(self, share_s: float) -> None:
        """The stage relaxation (NOTE 3) from the best start for ``share_s``: its bound and its schedule join the state."""
        relaxed = stage_relaxation(self.graph, self.costs, self.options, time_limit_s=share_s, mip_gap=self.mip_gap / 2, start=self.start)
        self.lower_bound = max(self.lower_bound, relaxed.bound_j)
        self.take("stage relaxation", relaxed.schedule)
        log.info("lower bound after the stage relaxation: %.10g J (%.6f x one plain step)", self.lower_bound, self.lower_bound / self.costs.plain_step_energy_j)

    def interval_relaxation(self, share_s: float) -> None:
        """The interval relaxation (NOTE 5) for ``share_s``: its bound joins the state, its schedules (at the budget and
        at the budget less a margin) the starts, its optimum (where it found one) is ``relaxed_j``."""
        interval_j, schedules, self.relaxed_j = interval_start(self.graph, self.costs, self.options, time_limit_s=share_s)
        self.lower_bound = max(self.lower_bound, interval_j)
        for schedule in schedules:
            self.take("interval relaxation", schedule)
        log.info("lower bound after the interval relaxation: %.10g J (%.6f x one plain step)", self.lower_bound, self.lower_bound / self.costs.plain_step_energy_j)

    def cpsat(self, share_s: float, max_columns: int) -> None:
        """CP-SAT on the interval relaxation with all its rows from the best start (NOTE 14) for ``share_s``, stopped once
        its bound certifies the start: its bound and its schedule join the state."""
        found = interval_bound_cpsat(
            self.graph, self.costs, self.options, time_limit_s=share_s, mip_gap=self.mip_gap / 2, start=self.start, target_j=self.certifying_j(),
            max_columns=max_columns,
        )
        self.lower_bound = max(self.lower_bound, found.bound_j)
        self.take("CP-SAT", found.schedule)

    def split_bound(self) -> None:
        """NOTE 34: where the interval relaxation's own bound stalls near the best start (the relaxation raised the bound
        above the eviction and rebuild bounds, the start within ``SPLIT_NEAR`` of it, uncertified), with a limit of
        ``SPLIT_MIN_LIMIT_S`` or more, the relaxation split at a cut vertex with its coupling memory rows priced and the
        part before the cut in buckets (:func:`~poetlab.planners.poet.lagrange.split_bound`, its docstring says why it
        is valid), each bucket stopped once it certifies the best start; its bound joins the lower bound, so the window
        search that follows stops at a schedule it certifies."""
        options, limit_s = self.options, self.time_limit_s
        share_s = self.left_s() - max(SPLIT_RESERVE_S, SPLIT_RESERVE_SHARE * limit_s)
        if not (
            limit_s >= SPLIT_MIN_LIMIT_S and options.remat and not options.charge_pagein and not options.compression and not self.proven()
            and self.start_sim is not None and self.start_gap() <= SPLIT_NEAR and self.lower_bound > self.evicted_j * (1 + self.mip_gap)
            and self.left_s() >= SPLIT_MIN_LEFT_S
        ):
            return
        log.info("the best start is %.3f%% above the interval relaxation's bound: the split bound for %.1f s", 100 * self.start_gap(), share_s)
        found = split_bound(self.graph, self.costs, options, share_s, self.certifying_j(), max_columns=SPLIT_MAX_COLUMNS)
        if found.bound_j is not None:
            self.lower_bound = max(self.lower_bound, found.bound_j)
        log.info("lower bound after the split bound: %.10g J (%.6f x one plain step)", self.lower_bound, self.lower_bound / self.costs.plain_step_energy_j)

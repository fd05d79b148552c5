"""Lower bounds on the energy of every schedule, proven without solving POET's MILP.

The trivial bound is one plain step: every node is computed at least once. The eviction bound adds
what the memory budget forces (NOTE 2 in docs/solve.md):

- While stage t computes node t, RAM holds node t's output and its inputs. Any other tensor i < t that
  a later node (> t) reads, and that stays in RAM from the start of stage t to the start of stage t + 1
  without being recomputed or paged in, is held at that moment too: nothing frees a tensor that is kept
  for the next stage. So if the tensors "live across" stage t exceed what the budget leaves, some of
  them must be regenerated at least once: recomputed (at least its own rerun energy and runtime) or
  paged out and in (both energies; in time only with ``count_paging_time``).
- Each tensor's regeneration costs at least once in total, whatever stages it relieves. So the
  cheapest set of tensors that relieves every stage at once is a lower bound on the extra energy:
  a small covering problem (one binary per tensor and lever, one row per stage over budget, the
  runtime budget's slack shared by the recomputations), solved exactly by HiGHS (through scipy) in
  milliseconds; stopped early, its own proven bound is used.

The bound holds in faithful mode and with every fix (``charge_pagein`` and ``params_in_budget`` only
tighten memory; ``count_paging_time`` is honoured). With compression the bound is the trivial one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.planners.heuristics import minimal_recompute
from poetlab.planners.poet.milp import MilpOptions
from poetlab.core.schedule import Schedule

log = logging.getLogger("poetlab.bounds")

#: HiGHS's default absolute MIP gap (scipy's ``milp`` sets no other), in the objective's units (plain steps
#: here): HiGHS stops "optimal" once its incumbent is this close to its bound, and then reports a dual bound
#: that may be the incumbent itself. On VGG-16 on the A72 the covering problem's reported bound sat 3e-7 of a
#: plain step above a schedule that fits (its optimum, solved with the objective scaled, is that schedule's).
HIGHS_ABS_GAP = 1e-6


#: The covering problem's relative gap.
COVER_GAP = 1e-6


def proven_extra(result, mip_gap: float) -> float | None:
    """The lower bound scipy's ``milp`` ``result`` proves on its objective, ``mip_gap`` the relative gap it was
    given: stopped "optimal", its incumbent less what HiGHS's stopping rule allows (the larger of the absolute
    and the relative gap; its reported dual bound where that is lower); stopped early, its dual bound. None
    where nothing is proven."""
    dual = getattr(result, "mip_dual_bound", None)
    dual = float(dual) if dual is not None and np.isfinite(dual) else None
    if result.status == 0 and result.fun is not None:
        within = float(result.fun) - max(HIGHS_ABS_GAP, mip_gap * abs(float(result.fun)))
        return within if dual is None else min(dual, within)
    return dual


def eviction_demands(graph: TrainingGraph, budget_bytes: float) -> list[tuple[int, np.ndarray, float]]:
    """(stage t, the tensors live across it, the bytes left for them) for each stage t whose live-across
    tensors do not fit. Stage t's live-across tensors are those before t, not read by t, read after t;
    what is left is the budget less node t's output and inputs."""
    b = graph.output_bytes_least.astype(float)  # (the least each output holds: the rows stay valid)
    last_use = last_uses(graph)
    demands = []
    for t in range(1, graph.n_nodes - 1):
        live, room = live_across(graph, t, budget_bytes, last_use)
        if b[live].sum() > room:
            demands.append((t, live, room))
    return demands


def last_uses(graph: TrainingGraph) -> np.ndarray:
    """Per tensor, the last node that reads it (-1 for none)."""
    return np.array([max(users) if users else -1 for users in graph.consumers])


def live_across(graph: TrainingGraph, t: int, budget_bytes: float, last_use: np.ndarray) -> tuple[np.ndarray, float]:
    """Stage t's live-across tensors (before t, not read by t, read after t; ``last_use`` from :func:`last_uses`)
    and the bytes the budget leaves them beside node t's output and inputs, at their least."""
    b = graph.output_bytes_least
    inputs = sorted(set(graph.nodes[t].inputs))
    live = np.flatnonzero(last_use[:t] > t)
    return live[~np.isin(live, inputs)], float(budget_bytes - float(b[t]) - float(b[inputs].sum()))


@dataclass(frozen=True)
class CoverProblem:
    """The covering MILP of NOTE 2 as arrays, for :func:`_cover` and for the bounds that add rows to it
    (:mod:`poetlab.planners.poet.rebuilds`): columns (recompute tensor i for i < T, page tensor i for i < T),
    ``cost`` in plain steps, ``upper`` 0 where a lever is not allowed, ``constraints`` scipy's rows, and the
    stages over budget (:func:`eviction_demands`) with the budget they were measured against."""

    cost: np.ndarray
    upper: np.ndarray
    constraints: list
    demands: list
    budget_bytes: float


def cover_problem(graph: TrainingGraph, costs: CostModel, options: MilpOptions, linked: bool = False) -> CoverProblem | None:
    """The covering MILP of NOTE 2, or None where no stage is over budget. With ``linked``, a recomputed
    tensor's inputs are never evicted (rows for a schedule, not for the bound)."""
    from scipy.optimize import LinearConstraint

    budget = float(options.ram_budget_bytes) - (2 * graph.param_bytes if options.params_in_budget else 0)
    demands = eviction_demands(graph, budget)
    if not demands:
        return None
    T = graph.n_nodes
    b = graph.output_bytes_least.astype(float)  # (the least each output holds: the rows stay valid)
    movable = ~graph.pinned
    # columns: recompute tensor i (T), page tensor i out and in (T); a lever not allowed is fixed at 0
    cost = np.concatenate([costs.recompute_energy_j, costs.pagein_energy_j + costs.pageout_energy_j]) / costs.plain_step_energy_j
    allowed = np.concatenate([movable & options.remat, movable & options.paging])
    rows = np.concatenate([np.full(live.size, r) for r, (_, live, _) in enumerate(demands)])
    live_all = np.concatenate([live for _, live, _ in demands])
    cover = sp.csr_matrix((np.tile(b[live_all], 2), (np.tile(rows, 2), np.concatenate([live_all, live_all + T]))), shape=(len(demands), 2 * T))
    constraints = [LinearConstraint(cover, np.array([b[live].sum() - room for _, live, room in demands]), np.inf), LinearConstraint(sp.hstack([sp.eye(T), sp.eye(T)]).tocsr(), -np.inf, 1.0)]
    if options.runtime_budget_factor is not None:
        slack = (options.runtime_budget_factor - 1.0) * costs.plain_step_runtime_s
        uses = np.concatenate([costs.recompute_runtime_s, costs.pagein_time_s + costs.pageout_time_s if options.count_paging_time else np.zeros(T)])
        constraints.append(LinearConstraint(uses[None, :], -np.inf, slack))
    if linked:  # recompute i  +  evict j  <= 1  for each input j of i
        edges = np.array(graph.edges, dtype=np.int64).reshape(-1, 2)
        n = len(edges)
        link = sp.csr_matrix((np.ones(3 * n), (np.repeat(np.arange(n), 3), np.stack([edges[:, 1], edges[:, 0], edges[:, 0] + T], axis=1).ravel())), shape=(n, 2 * T))
        constraints.append(LinearConstraint(link, -np.inf, 1.0))
    return CoverProblem(cost, allowed.astype(float), constraints, demands, budget)


def _cover(graph: TrainingGraph, costs: CostModel, options: MilpOptions, linked: bool, time_limit_s: float, gap: float = COVER_GAP):
    """The covering MILP of NOTE 2 solved, or None where no stage is over budget: scipy's result, whose x is
    (recompute tensor i for i < T, page tensor i for i < T) and whose objective is in plain steps."""
    problem = cover_problem(graph, costs, options, linked)
    if problem is None:
        return None
    from scipy.optimize import Bounds, milp

    n = problem.cost.size
    return milp(problem.cost, constraints=problem.constraints, integrality=np.ones(n), bounds=Bounds(0.0, problem.upper), options={"time_limit": time_limit_s, "mip_rel_gap": gap})


@dataclass(frozen=True)
class EvictionCover:
    """The eviction bound (J) and the covering problem's best solution: per tensor, whether it recomputes it
    (None where it has none: nothing over budget, compression, no solution). The solution is what the primal
    phase restricts the interval relaxation to (:mod:`poetlab.planners.poet.primal`, NOTE 18)."""

    bound_j: float
    recompute: np.ndarray | None = None


def eviction_cover(graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float = 10.0) -> EvictionCover:
    """:func:`eviction_bound`, with the covering problem's solution."""
    trivial = costs.plain_step_energy_j
    result = None if options.compression else _cover(graph, costs, options, linked=False, time_limit_s=time_limit_s)
    if result is None:
        return EvictionCover(trivial)
    if result.status == 2:  # no regeneration meets the budgets: the MILP will say so with its reasons
        log.info("eviction bound: the covering problem is infeasible")
        return EvictionCover(trivial)
    extra = proven_extra(result, COVER_GAP)
    recompute = None if result.x is None else np.asarray(result.x[: graph.n_nodes]).round().astype(bool)
    return EvictionCover(trivial if extra is None else trivial * (1.0 + max(0.0, extra)), recompute)


def eviction_bound(graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float = 10.0) -> float:
    """A lower bound (J) on the energy of every schedule meeting ``options``' budgets: one plain step plus
    the cheapest regeneration of the tensors the budget cannot hold across some stage. Returns the
    trivial bound where the argument does not apply (compression) or proves nothing."""
    return eviction_cover(graph, costs, options, time_limit_s).bound_j


def cover_schedules(graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float = 2.0) -> list[Schedule]:
    """Schedules built from the covering problem's solutions (quick starts for the MILP): each chosen
    tensor leaves RAM over the longest idle interval between two of its uses, paged out after the first
    and in before the second, or recomputed where it is next needed (with what that needs). Solved
    twice: as for the bound, and ``linked`` (a recomputed tensor's inputs stay), whose schedule costs
    exactly its objective. The caller replays them; those over the budgets are dropped there."""
    if options.compression or options.charge_pagein:
        return []
    schedules = []
    for linked in (False, True):
        result = _cover(graph, costs, options, linked=linked, time_limit_s=time_limit_s, gap=1e-3)
        if result is None or result.x is None:
            continue
        T = graph.n_nodes
        chosen = np.asarray(result.x).round().astype(bool)
        schedules.append(evict_schedule(graph, chosen[:T], chosen[T:]))
    return schedules


def evict_schedule(graph: TrainingGraph, recompute: np.ndarray, page: np.ndarray) -> Schedule:
    """Checkpoint-all, less the chosen tensors over their longest idle interval (the covers' schedules, and the rebuild
    bound's seed for a chain plan: :mod:`poetlab.planners.poet.rebuilds`)."""
    T = graph.n_nodes
    uses = [sorted(set(users)) for users in graph.consumers]
    stage = np.arange(T)
    last_use = np.array([u[-1] if u else i for i, u in enumerate(uses)])
    S_RAM = (stage[None, :] < stage[:, None]) & (last_use[None, :] >= stage[:, None])
    S_SSD, M_IN, M_OUT = (np.zeros((T, T), dtype=bool) for _ in range(3))
    for i in np.flatnonzero(recompute | page):
        points = [int(i), *uses[i]]
        k = int(np.argmax(np.diff(points))) if len(points) > 1 else 0
        previous, following = points[k], points[min(k + 1, len(points) - 1)]
        if page[i] and following - previous >= 3:  # out in stage previous + 1, in during stage following - 1
            S_RAM[previous + 2 : following, i] = False
            M_OUT[previous + 1, i] = M_IN[following - 1, i] = True
            S_SSD[previous + 2 : following, i] = True
        elif recompute[i] and following > previous:
            S_RAM[previous + 1 : following + 1, i] = False  # recomputed in stage `following`
    return Schedule.from_matrices(graph, minimal_recompute(graph, S_RAM, M_IN), S_RAM, S_SSD, M_IN, M_OUT)

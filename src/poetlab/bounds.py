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

import numpy as np
import scipy.sparse as sp

from poetlab.costs import CostModel
from poetlab.graph import TrainingGraph
from poetlab.milp import MilpOptions

log = logging.getLogger("poetlab.bounds")


def eviction_demands(graph: TrainingGraph, budget_bytes: float) -> list[tuple[int, np.ndarray, float]]:
    """(stage t, the tensors live across it, the bytes left for them) for each stage t whose live-across
    tensors do not fit. Stage t's live-across
    tensors are those before t, not read by t, read after t; what is left is the budget less node t's
    output and inputs."""
    b = graph.output_bytes.astype(float)
    T = graph.n_nodes
    last_use = np.array([max(users) if users else -1 for users in graph.consumers])
    demands = []
    for t in range(1, T - 1):
        inputs = sorted(set(graph.nodes[t].inputs))
        room = budget_bytes - b[t] - b[inputs].sum()
        live = np.flatnonzero(last_use[:t] > t)
        live = live[~np.isin(live, inputs)]
        if b[live].sum() > room:
            demands.append((t, live, float(room)))
    return demands


def eviction_bound(graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float = 10.0) -> float:
    """A lower bound (J) on the energy of every schedule meeting ``options``' budgets: one plain step plus
    the cheapest regeneration of the tensors the budget cannot hold across some stage. Returns the
    trivial bound where the argument does not apply (compression) or proves nothing."""
    trivial = costs.plain_step_energy_j
    if options.compression:
        return trivial
    budget = float(options.ram_budget_bytes) - (2 * graph.param_bytes if options.params_in_budget else 0)
    demands = eviction_demands(graph, budget)
    if not demands:
        return trivial
    from scipy.optimize import Bounds, LinearConstraint, milp

    T = graph.n_nodes
    b = graph.output_bytes.astype(float)
    movable = ~graph.pinned
    # columns: recompute tensor i (T), page tensor i out and in (T); a lever not allowed costs too much to use
    recompute = np.where(movable & options.remat, costs.recompute_energy_j, np.inf)
    page = np.where(movable & options.paging, costs.pagein_energy_j + costs.pageout_energy_j, np.inf)
    cost = np.concatenate([recompute, page]) / trivial
    allowed = np.isfinite(cost)
    rows = np.concatenate([np.full(live.size, r) for r, (_, live, _) in enumerate(demands)])
    live_all = np.concatenate([live for _, live, _ in demands])
    cover = sp.csr_matrix((np.tile(b[live_all], 2), (np.tile(rows, 2), np.concatenate([live_all, live_all + T]))), shape=(len(demands), 2 * T))
    constraints = [LinearConstraint(cover, np.array([b[live].sum() - room for _, live, room in demands]), np.inf), LinearConstraint(sp.hstack([sp.eye(T), sp.eye(T)]).tocsr(), -np.inf, 1.0)]
    if options.runtime_budget_factor is not None:
        slack = (options.runtime_budget_factor - 1.0) * costs.plain_step_runtime_s
        uses = np.concatenate([costs.recompute_runtime_s, costs.pagein_time_s + costs.pageout_time_s if options.count_paging_time else np.zeros(T)])
        constraints.append(LinearConstraint(uses[None, :], -np.inf, slack))
    result = milp(
        np.where(allowed, cost, 0.0), constraints=constraints, integrality=np.ones(2 * T), bounds=Bounds(0.0, np.where(allowed, 1.0, 0.0)),
        options={"time_limit": time_limit_s, "mip_rel_gap": 1e-6},
    )
    if result.status == 2:  # no regeneration meets the budgets: the MILP will say so with its reasons
        log.info("eviction bound: the covering problem is infeasible")
        return trivial
    extra = result.fun if result.status == 0 else getattr(result, "mip_dual_bound", None)
    if extra is None or not np.isfinite(extra):
        return trivial
    return trivial * (1.0 + max(0.0, float(extra)) * (1 - 1e-9))

"""The stage relaxation of POET's MILP: a smaller problem whose optimum bounds POET's from below, and
whose solutions are schedules once repaired.

POET's MILP (:mod:`poetlab.planners.poet.milp`) tracks RAM after every computation of every stage
(U), with FREE variables that say when an input is released; its LP relaxation is weak because a
fractional FREE lets it keep a tensor and free it at once (docs/solve.md, NOTE 3). The stage
relaxation keeps the schedule's variables and drops FREE and U:

- K[i, t] (S_RAM: tensor i in RAM at the start of stage t), R[i, t] (recompute i in stage t), I[i, t]
  (page i in during stage t), O[i] (i was paged out: its page-out energy once), Z[i, t] (i was in RAM
  at some stage start up to t);
- K[i, t + 1] <= K[i, t] + R[i, t] + I[i, t]  (the MILP's row (2)); I[i, t] <= K[i, t + 1], I[i, t] <= O[i],
  I[i, t] + K[i, t] <= 1, and a page-in only of a tensor in RAM at some earlier stage start (Z, which
  the MILP's page-out needs);
- a node computed in stage t has its inputs: K[u, t] + R[u, t] >= 1 for node t's inputs u, and
  R[v, t] <= K[u, t] + R[u, t] for a recomputed v;
- RAM at two moments of each stage, each a sum of tensors the MILP must hold then:
  at the start of stage t, everything K carries in (the MILP's U[t, 0]); while node t is computed,
  node t, its inputs, and every other tensor kept for stage t + 1 that is not paged in during stage t
  (the MILP frees only a tensor that is not kept, and a page-in lands at the end of the stage; with
  ``charge_pagein`` it holds RAM from the stage start, so it counts);
- the runtime budget, as in the MILP.

Every schedule of the MILP gives a solution of the relaxation of no higher cost (K = S_RAM, R its
reruns, I its page-ins of tensors kept for the next stage and not in RAM at the stage start, O = paged
out at least once, Z from K; the page-ins left out are waste), so the relaxation's optimum, or the dual bound of a solve stopped at its limit, is a lower bound on POET's.
The relaxation does not see RAM at the other moments of a stage (while a tensor is recomputed), so
one of its solutions may not fit; :func:`relaxation_schedule` turns it into a schedule (carries nothing
reads dropped, the fewest reruns that make it consistent, one page-out before the first page-in), and
the caller replays it: one that fits is a start (on vgg16_cifar/m4 at 10%, the optimum itself).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.schedule import Schedule
from poetlab.planners.heuristics import minimal_recompute
from poetlab.planners.poet.backends import run_milp
from poetlab.planners.poet.milp import MilpModel, MilpOptions
from poetlab.planners.poet.rows import SparseRows

log = logging.getLogger("poetlab.relaxation")


@dataclass(frozen=True)
class StageRelaxation:
    """The relaxation's answer: ``bound_j`` a proven lower bound on POET's energy (J; the trivial bound
    where nothing was proven), ``schedule`` its best solution made into a schedule (None without one;
    not yet replayed: it may exceed the budget), ``optimal`` whether the relaxation was solved to its
    gap."""

    bound_j: float
    schedule: Schedule | None
    optimal: bool


def _pairs(T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tensor i and stage t of every pair i < t, and a T x T index of them (-1 elsewhere)."""
    i, t = np.nonzero(np.triu(np.ones((T, T), dtype=bool), 1))
    index = np.full((T, T), -1, dtype=np.int64)
    index[i, t] = np.arange(i.size)
    return i, t, index


def build_relaxation(graph: TrainingGraph, costs: CostModel, options: MilpOptions):
    """(c, A, row_lower, row_upper, col_upper, index) of the stage relaxation, objective in plain steps
    (the constant one plain step left out); ``index`` maps "K", "R", "I" to T x T column indices
    [tensor, stage] (-1 where absent) and "O" to T columns."""
    T = graph.n_nodes
    b = graph.output_bytes_least.astype(float)  # (the least each output holds: the rows stay valid)
    budget = float(options.ram_budget_bytes) - (2 * graph.param_bytes if options.params_in_budget else 0)
    movable = ~graph.pinned
    pi, pt, pair = _pairs(T)
    n = pi.size
    K, R, I = pair, np.where(pair >= 0, pair + n, -1), np.where(pair >= 0, pair + 2 * n, -1)
    O = 3 * n + np.arange(T)
    Z = np.where(pair >= 0, pair + 3 * n + T, -1)  # Z[i, t]: tensor i was in RAM at some stage start <= t
    scale = costs.plain_step_energy_j
    c = np.concatenate([np.zeros(n), costs.recompute_energy_j[pi], costs.pagein_energy_j[pi], costs.pageout_energy_j, np.zeros(n)]) / scale
    col_upper = np.concatenate([
        np.ones(n),
        (movable[pi] & options.remat).astype(float),
        (movable[pi] & options.paging & (pt < T - 1)).astype(float),
        (movable & options.paging).astype(float),
        np.ones(n),
    ])
    rows = SparseRows()
    inf = np.inf
    # K[i, t + 1] <= K[i, t] + R[i, t] + I[i, t]  and  I[i, t] <= K[i, t + 1], for i < t < T - 1
    i, t = pi[pt < T - 1], pt[pt < T - 1]
    ids = rows.new(i.size, -inf, 0.0)
    rows.terms(ids, K[i, t + 1], 1.0)
    for family in (K, R, I):
        rows.terms(ids, family[i, t], -1.0)
    ids = rows.new(i.size, -inf, 0.0)
    rows.terms(ids, I[i, t], 1.0)
    rows.terms(ids, K[i, t + 1], -1.0)
    ids = rows.new(i.size, -inf, 1.0)  # I[i, t] + K[i, t] <= 1: no page-in of what is in RAM at the stage start
    rows.terms(ids, I[i, t], 1.0)
    rows.terms(ids, K[i, t], 1.0)
    # a page-in follows a page-out of a tensor in RAM at an earlier stage start: I[i, t] <= Z[i, t - 1],
    # Z[i, t] <= Z[i, t - 1] + K[i, t]
    ids = rows.new(n, -inf, 0.0)
    rows.terms(ids, I[pi, pt], 1.0)
    rows.terms(ids, Z[pi, pt - 1], -1.0)
    ids = rows.new(n, -inf, 0.0)
    rows.terms(ids, Z[pi, pt], 1.0)
    rows.terms(ids, Z[pi, pt - 1], -1.0)
    rows.terms(ids, K[pi, pt], -1.0)
    # I[i, t] <= O[i]
    ids = rows.new(n, -inf, 0.0)
    rows.terms(ids, I[pi, pt], 1.0)
    rows.terms(ids, O[pi], -1.0)
    # inputs: node t's in stage t, and a recomputed node's
    edges = np.array(graph.edges, dtype=np.int64).reshape(-1, 2)
    u, v = edges[:, 0], edges[:, 1]
    ids = rows.new(len(edges), 1.0, inf)
    rows.terms(ids, K[u, v], 1.0)
    rows.terms(ids, R[u, v], 1.0)
    e, t = np.nonzero(v[:, None] < np.arange(T)[None, :])
    ids = rows.new(e.size, -inf, 0.0)
    rows.terms(ids, R[v[e], t], 1.0)
    rows.terms(ids, K[u[e], t], -1.0)
    rows.terms(ids, R[u[e], t], -1.0)
    # RAM at the start of stage t >= 1: what K carries in (with node 0 if it is recomputed first)
    ids = rows.new(T - 1, -inf, budget)
    rows.terms(ids[pt - 1], K[pi, pt], b[pi])
    rows.terms(ids, R[0, 1:], b[0])
    if options.charge_pagein:
        rows.terms(ids[pt - 1], I[pi, pt], b[pi])
    # RAM while node t is computed, 1 <= t <= T - 2: node t, its inputs, and every other tensor kept
    # for stage t + 1 that is not paged in during stage t (with charge_pagein, paged in or not)
    stages = np.arange(1, T - 1)
    is_input = np.zeros((T, T), dtype=bool)  # [tensor, stage]
    is_input[u, v] = True
    room = budget - b[stages] - (is_input[:, stages] * b[:, None]).sum(axis=0)
    ids = rows.new(stages.size, -inf, room)
    sel = (pt < T - 1) & ~is_input[pi, pt]
    i, t = pi[sel], pt[sel]
    rows.terms(ids[t - 1], K[i, t + 1], b[i])
    if not options.charge_pagein:
        rows.terms(ids[t - 1], I[i, t], -b[i])
    if options.runtime_budget_factor is not None:
        slack = (options.runtime_budget_factor - 1.0) * costs.plain_step_runtime_s
        ids = rows.new(1, -inf, slack)
        rows.terms(np.full(n, ids[0]), R[pi, pt], costs.recompute_runtime_s[pi])
        if options.count_paging_time:
            rows.terms(np.full(n, ids[0]), I[pi, pt], costs.pagein_time_s[pi])
            rows.terms(np.full(T, ids[0]), O, costs.pageout_time_s)
    A = rows.matrix(4 * n + T)
    return c, A, rows.lower, rows.upper, col_upper, {"K": K, "R": R, "I": I, "O": O, "Z": Z}


def relaxation_point(graph: TrainingGraph, matrices: dict[str, np.ndarray], index: dict[str, np.ndarray]) -> np.ndarray:
    """A schedule's matrices (R, S_RAM, M_IN, M_OUT) as a point of the relaxation, the map of the
    validity argument: K = S_RAM, R its reruns, I its page-ins of tensors kept for the next stage and
    not in RAM at the stage start, O = paged out at least once."""
    T = graph.n_nodes
    S_RAM = np.asarray(matrices["S_RAM"], dtype=bool)
    kept_next = np.vstack([S_RAM[1:], np.zeros((1, T), dtype=bool)]) & ~S_RAM
    x = np.zeros(4 * int((index["K"] >= 0).sum()) + T)
    i, t = np.nonzero(index["Z"] >= 0)
    x[index["Z"][i, t]] = np.maximum.accumulate(S_RAM, axis=0)[t, i]
    for name, source in (("K", S_RAM), ("R", np.asarray(matrices["R"], dtype=bool)), ("I", np.asarray(matrices["M_IN"], dtype=bool) & kept_next)):
        i, t = np.nonzero(index[name] >= 0)
        x[index[name][i, t]] = source[t, i]
    x[index["O"]] = np.asarray(matrices["M_OUT"], dtype=bool).any(axis=0)
    return x


def stage_relaxation(
    graph: TrainingGraph, costs: CostModel, options: MilpOptions, time_limit_s: float, mip_gap: float = 1e-4, start: Schedule | None = None,
) -> StageRelaxation:
    """Solve the stage relaxation within ``time_limit_s`` (HiGHS in its worker process, one thread, from
    ``start``'s point where given): its proven bound (J) and its best solution as a schedule. With
    compression, nothing is proven (the trivial bound)."""
    trivial = costs.plain_step_energy_j
    if options.compression or graph.n_nodes < 3:
        return StageRelaxation(trivial, None, False)
    c, A, lower, upper, col_upper, index = build_relaxation(graph, costs, options)
    # one more column, fixed at 1, carries the plain step: the objective is the energy in J, and the
    # backend's relative gap is on the whole energy, as for POET's MILP
    T, n_cols = graph.n_nodes, c.size + 1
    plain = np.full((T, T), -1, dtype=np.int64)
    plain[0, 0] = c.size  # (MilpModel.energy_scale: the cost of the "R" diagonal's columns)
    model = MilpModel(
        c=np.append(c * trivial, trivial), A=sp.hstack([A, sp.csr_matrix((A.shape[0], 1))]).tocsr(), row_lower=lower, row_upper=upper,
        col_lower=np.append(np.zeros(c.size), 1.0), col_upper=np.append(col_upper, 1.0), integer=np.ones(n_cols, dtype=bool),
        index={"R": plain}, free_index=np.zeros((T, 0), dtype=np.int64), u_index=np.zeros((T, 0), dtype=np.int64),
        edges=np.zeros((0, 2), dtype=np.int64), node_bytes=graph.output_bytes.astype(float),
    )
    x0 = None if start is None else np.append(relaxation_point(graph, start.matrices().as_dict(), index), 1.0)
    answer = run_milp(model, solver="highs", time_limit_s=max(time_limit_s, 0.1), mip_gap=mip_gap, threads=1, start=x0)
    if answer.status == "infeasible":
        log.info("stage relaxation: infeasible")
        return StageRelaxation(trivial, None, False)
    bound = trivial if answer.bound is None or not np.isfinite(answer.bound) else max(trivial, answer.bound * (1 - 1e-9))
    schedule = None if answer.x is None else relaxation_schedule(graph, np.asarray(answer.x)[:-1], index)
    log.info("stage relaxation: bound %.6f x one plain step (%s)", bound / trivial, answer.status)
    return StageRelaxation(bound, schedule, answer.status == "optimal")


def relaxation_schedule(graph: TrainingGraph, x: np.ndarray, index: dict[str, np.ndarray]) -> Schedule:
    """A solution of the relaxation made into a schedule: S_RAM and the page-ins from it, carries that
    no node of the stage reads and the next stage does not keep dropped, one page-out (at the first
    stage start where the tensor is in RAM) before each tensor's first page-in, and the fewest reruns
    that make it consistent (:func:`~poetlab.planners.heuristics.minimal_recompute`)."""
    T = graph.n_nodes
    chosen = np.asarray(x).round() > 0.5
    S_RAM, R, M_IN = (np.zeros((T, T), dtype=bool) for _ in range(3))
    for name, matrix in (("K", S_RAM), ("R", R), ("I", M_IN)):
        i, t = np.nonzero(index[name] >= 0)
        matrix[t, i] = chosen[index[name][i, t]]
    R |= np.eye(T, dtype=bool)
    inputs = [sorted(set(node.inputs)) for node in graph.nodes]
    for t in range(T - 1, 0, -1):
        keep = S_RAM[t + 1] if t + 1 < T else np.zeros(T, dtype=bool)
        read = np.zeros(T, dtype=bool)
        read[[u for k in np.flatnonzero(R[t]) for u in inputs[k]]] = True
        S_RAM[t] &= keep | read
    M_IN[:-1] &= S_RAM[1:]
    M_IN[-1] = False
    S_SSD, M_OUT = np.zeros((T, T), dtype=bool), np.zeros((T, T), dtype=bool)
    for i in np.flatnonzero(M_IN.any(axis=0)):
        first_in = int(np.flatnonzero(M_IN[:, i])[0])
        resident = [t for t in range(i + 1, first_in) if S_RAM[t, i]]
        if not resident:  # nothing to page out from: recompute instead (minimal_recompute below)
            M_IN[:, i] = False
            continue
        M_OUT[resident[0], i] = True
        S_SSD[resident[0] + 1 :, i] = True
    return Schedule.from_matrices(graph, minimal_recompute(graph, S_RAM, M_IN), S_RAM, S_SSD, M_IN, M_OUT)

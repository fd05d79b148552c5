"""The POET release's MILP (poet/poet_solver_gurobi.py), transcribed constraint by constraint.

A reference for poetlab's faithful mode: every T x T variable exists (those the release fixes to zero by
equality rows are fixed here by their bounds, which is the same feasible set), the edge list keeps the
release's duplicate (its first gradient node reads the loss twice), the big-M of the free rows counts
every distinct later consumer (not only those that can run in the stage), and the memory recurrence
runs over every k < T - 1 in every stage. Solved in-process with HiGHS, for tests and benchmarks only.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def build_release_milp(graph, costs, ram_budget_bytes: float, runtime_budget_factor: float | None):
    """(c, A, row_lower, row_upper, col_lower, col_upper, n_integer_first): the release's model."""
    T = graph.n_nodes
    b = graph.output_bytes.astype(float)
    edges = [(dep, i) for i, node in enumerate(graph.nodes) for dep in node.inputs]  # duplicates kept
    E = len(edges)
    successors = [set() for _ in range(T)]
    for u, v in edges:
        successors[u].add(v)
    n = 0

    def block(shape):
        nonlocal n
        ids = np.arange(n, n + int(np.prod(shape))).reshape(shape)
        n += ids.size
        return ids

    R, SRam, SSd, MIn, MOut = (block((T, T)) for _ in range(5))
    F = block((T, E))
    U = block((T, T))
    lower = np.zeros(n)
    upper = np.ones(n)
    upper[U.ravel()] = ram_budget_bytes
    t_i, i_i = np.indices((T, T))
    upper[R[i_i > t_i]] = 0
    for S in (SRam, SSd):
        upper[S[i_i >= t_i]] = 0
    for M in (MIn, MOut):
        upper[M[i_i > t_i]] = 0
    lower[R[np.arange(T), np.arange(T)]] = 1
    c = np.zeros(n)
    c[R] = costs.compute_energy_j[None, :]
    c[MIn] = costs.pagein_energy_j[None, :]
    c[MOut] = costs.pageout_energy_j[None, :]

    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(terms, low, high):
        r = len(lo)
        for col, val in terms:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        lo.append(low)
        hi.append(high)

    for u, v in edges:
        for t in range(T):
            row(((R[t, v], 1), (R[t, u], -1), (SRam[t, u], -1)), -np.inf, 0)
    for t in range(T - 1):
        for i in range(T):
            row(((SRam[t + 1, i], 1), (SRam[t, i], -1), (R[t, i], -1), (MIn[t, i], -1)), -np.inf, 0)
            row(((SSd[t + 1, i], 1), (SSd[t, i], -1), (MOut[t, i], -1)), -np.inf, 0)
    for t in range(T):
        for j in range(T):
            row(((MIn[t, j], 1), (SSd[t, j], -1)), -np.inf, 0)
            row(((MOut[t, j], 1), (SRam[t, j], -1)), -np.inf, 0)
    for t in range(T):
        for e, (i, k) in enumerate(edges):
            later = [j for j in successors[i] if j > k]
            # hazards h = 1 - R[t,k] + SRam[t+1,i] + sum R[t,j]; written as h - 1 = R-side terms
            terms = [(R[t, k], 1)] + ([(SRam[t + 1, i], -1)] if t + 1 < T else []) + [(R[t, j], -1) for j in later]
            big_m = (2 if t + 1 < T else 1) + len(later)
            row([(F[t, e], -1)] + terms, -np.inf, 0)  # 1 - F <= h
            row([(F[t, e], -big_m)] + terms, 1 - big_m, np.inf)  # M (1 - F) >= h
    preds = [[] for _ in range(T)]
    for e, (i, k) in enumerate(edges):
        preds[k].append((e, i))
    for t in range(T):
        row([(U[t, 0], 1), (R[t, 0], -b[0])] + [(SRam[t, i], -b[i]) for i in range(T)], 0, 0)
        for k in range(T - 1):
            row([(U[t, k + 1], 1), (U[t, k], -1), (R[t, k + 1], -b[k + 1])] + [(F[t, e], b[i]) for e, i in preds[k]], 0, 0)
    if runtime_budget_factor is not None:
        runtime = np.broadcast_to(costs.runtime_s[None, :], (T, T))
        row(list(zip(R.ravel(), runtime.ravel())), -np.inf, runtime_budget_factor * float(costs.runtime_s.sum()))
    A = sp.csr_matrix((vals, (rows, cols)), shape=(len(lo), n))
    A.sum_duplicates()
    integer = np.ones(n, dtype=bool)
    integer[U.ravel()] = False
    return c, A, np.array(lo), np.array(hi), lower, upper, integer


def solve_release_milp(graph, costs, ram_budget_bytes, runtime_budget_factor, mip_gap=1e-6, time_limit_s=300.0):
    """(status, objective, bound) of the release's model solved by HiGHS in this process, one thread."""
    import highspy

    c, A, row_lower, row_upper, col_lower, col_upper, integer = build_release_milp(graph, costs, ram_budget_bytes, runtime_budget_factor)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", mip_gap)
    h.setOptionValue("mip_abs_gap", 0.0)
    h.setOptionValue("time_limit", time_limit_s)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    inf = highspy.kHighsInf
    A = A.tocsc()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = A.shape[1], A.shape[0]
    scale = float(costs.plain_step_energy_j)  # joules are tiny: HiGHS's tolerances need an objective near 1
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = c / scale, col_lower, col_upper
    lp.row_lower_ = np.where(np.isfinite(row_lower), row_lower, -inf)
    lp.row_upper_ = np.where(np.isfinite(row_upper), row_upper, inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = A.indptr, A.indices, A.data
    lp.integrality_ = [highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous for flag in integer]
    h.passModel(lp)
    h.run()
    info = h.getInfo()
    return h.modelStatusToString(h.getModelStatus()), scale * info.objective_function_value, scale * info.mip_dual_bound

"""Rows that give the interval relaxation the eviction bound's choices: one per tensor and idle gap (NOTE 7
in docs/solve.md).

The interval relaxation (:mod:`poetlab.planners.poet.intervals`, NOTE 5) prices a regeneration per
interval, so its LP can spread one page-in or recomputation over many intervals, a fraction in each:
the tensor is then "partly held" at each row stage, and the LP pays the whole regeneration once while
every stage's memory row sees only a fraction of the tensor. On resnet18_cifar/m4 at 10% its LP is
1.0425 plain steps where the eviction bound's LP (NOTE 2, one binary per tensor) is 1.0699, and HiGHS
spends its share of the limit climbing back to the eviction bound.

A tensor j's *idle gap* is the run of stages between two of its uses (or its computation and its
first use). For each gap (j, u), u the use that ends it, holding a row stage t_a across which j is
live, two binaries:

- ZR[j, u]: j is recomputed in a stage t_{a0} + 1 .. u (t_{a0} the gap's first such row stage);
- ZP[j, u]: j is paged in in a stage t_{a0} .. u - 1.

Rows: ZR[j, u] + ZP[j, u] + H[j, a] >= 1 at every such row stage t_a (not held across t_a, j must come
back before u); ZR <= the sum of RC[j, .] over the intervals that meet those stages; ZP <= the sum of
PG[j, .] likewise; O[j] >= ZP. They cost nothing and cut off no solution of the relaxation (each
integral point extends with ZR, ZP the largest RC, PG of the gap), so the bound keeps NOTE 5's proof;
what they change is the LP, which is never below the eviction bound's LP, and what HiGHS can branch on
(a few hundred binaries that decide the eviction bound's cover).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

import numpy as np
import scipy.sparse as sp

from poetlab.core.graph import TrainingGraph
from poetlab.planners.poet.rows import SparseRows

Problem = TypeVar("Problem")


def gap_columns(graph: TrainingGraph, stages: list[int], tracked: list[list[int]]) -> tuple[dict[tuple[int, int], int], list[tuple[int, int, int]]]:
    """The idle gaps (tensor, the use that ends it) -> the index of its row stage a0 (the first row stage in
    it), and (row stage index, tensor, gap index) for each row stage where a tracked tensor is live: before
    the stage, not read by it, read after it."""
    uses = [np.array(sorted(set(users)), dtype=np.int64) for users in graph.consumers]
    first: dict[tuple[int, int], int] = {}
    index: dict[tuple[int, int], int] = {}
    live = []
    for a, t in enumerate(stages):
        reads = set(graph.nodes[t].inputs)
        for j in tracked[a]:
            if j >= t or j in reads or uses[j].size == 0 or uses[j][-1] <= t:
                continue
            gap = (j, int(uses[j][np.searchsorted(uses[j], t)]))
            if gap not in index:
                index[gap] = len(index)
                first[gap] = a
            live.append((a, j, index[gap]))
    return first, live


def with_gap_rows(graph: TrainingGraph, problem: Problem) -> Problem:
    """``problem`` (an interval relaxation, :func:`poetlab.planners.poet.intervals.interval_problem`) with the
    idle-gap columns ZR, ZP (cost 0, binary) and their rows appended after its own columns and rows."""
    stages, H, RC, PG = problem.stages, problem.H, problem.RC, problem.PG
    first, live = gap_columns(graph, stages, problem.tracked)
    m = len(stages)
    n0 = problem.cost.size
    nz = len(first)
    zr = n0 + np.arange(nz)
    zp = n0 + nz + np.arange(nz)
    rows = SparseRows()
    for a, j, g in live:  # not held across t_a: regenerated before the use that ends the gap
        rows.row([int(zr[g]), int(zp[g]), H[a][j]], [1.0, 1.0, 1.0], 1.0, np.inf)
    for g, ((j, u), a0) in enumerate(first.items()):  # gaps in the order of their columns
        # interval a: recomputations in stages t_a + 1 .. t_{a+1}, page-ins in t_a .. t_{a+1} - 1
        recomputes = [RC[a][j] for a in range(a0, m) if stages[a] < u and j in RC[a]]
        pageins = [PG[a][j] for a in range(a0, m) if stages[a] <= u - 1 and j in PG[a]]
        rows.row([int(zr[g]), *recomputes], [1.0] + [-1.0] * len(recomputes), -np.inf, 0.0)
        rows.row([int(zp[g]), *pageins], [1.0] + [-1.0] * len(pageins), -np.inf, 0.0)
        rows.row([int(zp[g]), j], [1.0, -1.0], -np.inf, 0.0)  # column j is O[j], paged out at least once
    extra = rows.matrix(n0 + 2 * nz)
    A = sp.vstack([sp.hstack([problem.A, sp.csr_matrix((problem.A.shape[0], 2 * nz))]), extra]).tocsr()
    zeros = np.zeros(2 * nz)
    return replace(
        problem, cost=np.concatenate([problem.cost, zeros]), upper=np.concatenate([problem.upper, zeros + 1.0]), A=A,
        row_lower=np.concatenate([problem.row_lower, rows.lower]), row_upper=np.concatenate([problem.row_upper, rows.upper]),
        runtime=None if problem.runtime is None else np.concatenate([problem.runtime, zeros]), gaps=first,
    )

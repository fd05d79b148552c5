"""Kirisame et al., "Dynamic Tensor Rematerialization" (ICLR 2021).

DTR is an online, greedy runtime: it runs the program's operations in their order and, whenever an
allocation would exceed the memory budget, evicts the resident tensor with the smallest heuristic score
until the allocation fits; when an evicted tensor is needed again it is rematerialized by rerunning its
parent operation, recursively rematerializing whichever of that operation's inputs are evicted too.
No planning, no paging, no lookahead.

What is reproduced: the replay of checkpoint-all's order (forward then backward, node by node), the
program's own frees (a tensor is released after its last reader, as checkpoint-all does, so at a
budget of checkpoint-all's peak DTR evicts nothing and is checkpoint-all), locking of the inputs of the
operation being (re)run, recursive rematerialization, and the paper's heuristic
``h_DTR(t) = (c0(t) + sum of c0 over e*(t)) / (m(t) * s(t))``, where c0 is a tensor's compute time
(``costs.runtime_s``), m its size, s its staleness (time since its last access on the simulated clock,
which advances by the runtime of every computation, recomputations included), and e*(t) its *evicted
neighbourhood*: the evicted tensors that rematerializing t would need (evicted ancestors reached
through evicted tensors) plus the evicted tensors whose rematerialization would need t (evicted
descendants reached through evicted tensors that a later operation may still need). We compute e*(t)
exactly on the graph, which the paper's h_DTR defines and its h_DTR-eq-class approximates with a
union-find; the simpler local heuristic ``c0(t) / (m(t) * s(t))`` is :data:`LOCAL`.

What is not: DTR's heuristic caching and sampling of candidates, tensor aliasing and in-place operations,
and banishing as an explicit step (a released tensor is freed and, if a later rematerialization needs
it, recomputed). DTR never evicts constants such as the input batch; the kit's graphs make the input a
node like any other, which the MILP may recompute at its cost-model cost (zero
flop in the release), so :func:`plan` lets DTR evict and recompute it too, for a like-for-like
comparison, and :func:`plan_pinned` pins it as the paper does. DTR optimizes
compute time; it is judged on the energy our simulator sums. Every operation serving the original
operation of node t (its rematerializations, evictions and the node itself) carries stage t.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from poetlab.planners.baselines.base import Budgets, CannotMeetBudget, PlanOptions, within_budgets
from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import Op, OpKind, Schedule

METHOD = "dtr"
H_DTR = "h_dtr"
LOCAL = "local"
HEURISTICS = (H_DTR, LOCAL)

#: Computations allowed per node of the graph before DTR is declared to thrash.
MAX_COMPUTES_PER_NODE = 100


@dataclass(frozen=True)
class DtrGraph:
    """What DTR reads from the graph and the cost model, as plain arrays."""

    inputs: tuple[tuple[int, ...], ...]
    consumers: tuple[tuple[int, ...], ...]
    nbytes: np.ndarray
    cost_s: np.ndarray
    last_use: np.ndarray
    pinned: np.ndarray
    names: tuple[str, ...]

    @classmethod
    def build(cls, graph: TrainingGraph, costs: CostModel, pin_sources: bool = False) -> DtrGraph:
        consumers = graph.consumers
        return cls(
            inputs=tuple(tuple(sorted(set(node.inputs))) for node in graph.nodes),
            consumers=consumers,
            nbytes=graph.output_bytes.astype(np.int64),
            cost_s=np.asarray(costs.runtime_s, dtype=float),
            last_use=np.array([max(users, default=i) for i, users in enumerate(consumers)]),
            pinned=np.array([pin_sources and not node.inputs for node in graph.nodes], dtype=bool) | graph.pinned,
            names=tuple(node.name for node in graph.nodes),
        )

    @property
    def n(self) -> int:
        return len(self.inputs)


class _Runtime:
    """DTR's state while replaying one step; local to one :func:`replay` call."""

    def __init__(self, g: DtrGraph, ram_bytes: float, runtime_budget_s: float | None, heuristic: str):
        self.g = g
        self.ram_bytes = ram_bytes
        self.runtime_budget_s = runtime_budget_s
        self.score: Callable[[int], float] = self._h_dtr if heuristic == H_DTR else self._h_local
        n = g.n
        self.resident = np.zeros(n, dtype=bool)
        self.computed = np.zeros(n, dtype=bool)
        self.locks = np.zeros(n, dtype=np.int64)
        self.last_access = np.zeros(n)
        self.clock = 0.0
        self.used = 0
        self.stage = 0
        self.n_computes = 0
        self.max_computes = MAX_COMPUTES_PER_NODE * n
        self.ops: list[Op] = []
        self._needed: np.ndarray | None = None

    # ---- the heuristics ---------------------------------------------------------------------------
    def _staleness(self, t: int) -> float:
        """Time since the last access; the epsilon keeps a tensor touched this instant evictable last
        but comparable."""
        return self.clock - self.last_access[t] + 1e-12 * (1.0 + self.clock)

    def _h_local(self, t: int) -> float:
        return self.g.cost_s[t] / (self.g.nbytes[t] * self._staleness(t))

    def _evicted_needed(self) -> np.ndarray:
        """Evicted tensors that some later operation may still have to rematerialize: those with a
        reader at or after the current stage, and the evicted ancestors such tensors need."""
        if self._needed is None:
            g = self.g
            evicted = self.computed & ~self.resident
            needed = evicted & (g.last_use >= self.stage)
            for j in range(g.n - 1, -1, -1):
                if needed[j]:
                    for u in g.inputs[j]:
                        if evicted[u]:
                            needed[u] = True
            self._needed = needed
        return self._needed

    def _h_dtr(self, t: int) -> float:
        """h_DTR with the exact evicted neighbourhood e*(t)."""
        g = self.g
        evicted = self.computed & ~self.resident
        needed = self._evicted_needed()
        seen = {t}
        up = [u for u in g.inputs[t] if evicted[u]]
        down = [v for v in g.consumers[t] if needed[v]]
        cost = g.cost_s[t]
        while up:
            u = up.pop()
            if u not in seen:
                seen.add(u)
                cost += g.cost_s[u]
                up.extend(w for w in g.inputs[u] if evicted[w] and w not in seen)
        while down:
            v = down.pop()
            if v not in seen:
                seen.add(v)
                cost += g.cost_s[v]
                down.extend(w for w in g.consumers[v] if needed[w] and w not in seen)
        return cost / (g.nbytes[t] * self._staleness(t))

    # ---- operations ---------------------------------------------------------------------------------
    def _emit(self, kind: OpKind, node: int) -> None:
        self.ops.append(Op(kind, node, self.stage))
        self._needed = None

    def _free(self, t: int) -> None:
        self._emit(OpKind.FREE, t)
        self.resident[t] = False
        self.used -= int(self.g.nbytes[t])

    def _make_room(self, node: int) -> None:
        """Evict smallest-score tensors until ``node``'s output fits."""
        g = self.g
        need = int(g.nbytes[node])
        while self.used + need > self.ram_bytes:
            candidates = np.flatnonzero(self.resident & (self.locks == 0) & ~g.pinned & (g.nbytes > 0))
            if candidates.size == 0:
                raise CannotMeetBudget(
                    f"{METHOD}: no evictable tensor is left to make room for {g.names[node]} ({need:,} bytes) at stage "
                    f"{self.stage}: {self.used:,} bytes are held by locked inputs and pinned sources, budget "
                    f"{int(self.ram_bytes):,} bytes"
                )
            scores = [self.score(int(c)) for c in candidates]
            self._free(int(candidates[int(np.argmin(scores))]))

    def _compute(self, node: int) -> None:
        g = self.g
        self.n_computes += 1
        if self.n_computes > self.max_computes:
            raise CannotMeetBudget(
                f"{METHOD}: gave up after {self.max_computes:,} computations at stage {self.stage} ({g.names[self.stage]}): "
                f"the budget {int(self.ram_bytes):,} bytes makes it thrash"
            )
        self._make_room(node)
        self._emit(OpKind.COMPUTE, node)
        self.resident[node] = True
        self.computed[node] = True
        self.used += int(g.nbytes[node])
        self.clock += g.cost_s[node]
        self.last_access[node] = self.clock
        self.last_access[list(g.inputs[node])] = self.clock
        if self.runtime_budget_s is not None and self.clock > self.runtime_budget_s * (1 + 1e-9):
            raise CannotMeetBudget(
                f"{METHOD}: its recomputations take {self.clock:.6g} s of compute by stage {self.stage} "
                f"({g.names[self.stage]}), over the runtime budget {self.runtime_budget_s:.6g} s"
            )

    def materialize(self, node: int) -> None:
        """Compute ``node``, first rematerializing its evicted inputs (and theirs), depth first.

        Iterative, so that deep chains do not hit Python's recursion limit. A node's inputs are locked
        from the moment its frame starts until it has run, so a resident input cannot be evicted to
        make room for a sibling."""
        g = self.g
        stack: list[tuple[int, int]] = [(node, -1)]
        while stack:
            current, position = stack.pop()
            ins = g.inputs[current]
            if position < 0 and self.resident[current]:
                continue
            if position < 0:
                self.locks[list(ins)] += 1
                position = 0
            while position < len(ins) and self.resident[ins[position]]:
                position += 1
            if position < len(ins):
                stack.append((current, position + 1))
                stack.append((ins[position], -1))
                continue
            self._compute(current)
            self.locks[list(ins)] -= 1

    def release_dead(self) -> None:
        """The program's frees after the current operation: every resident tensor that no later
        operation reads."""
        for t in np.flatnonzero(self.resident & (self.g.last_use <= self.stage)):
            self._free(int(t))


def replay(
    graph: TrainingGraph,
    costs: CostModel,
    ram_bytes: float,
    runtime_budget_s: float | None = None,
    heuristic: str = H_DTR,
    pin_sources: bool = False,
) -> Schedule:
    """DTR's operations for one step of ``graph`` under ``ram_bytes``; CannotMeetBudget when it cannot
    make room, thrashes, or breaks ``runtime_budget_s``. ``pin_sources`` never evicts the graph's
    sources (the input batch), as DTR never evicts constants."""
    if heuristic not in HEURISTICS:
        raise ValueError(f"unknown DTR heuristic {heuristic!r}; valid: {', '.join(HEURISTICS)}")
    footprint, node = min_footprint_bytes(graph)
    if ram_bytes < footprint:
        raise CannotMeetBudget(
            f"{METHOD}: RAM budget {int(ram_bytes):,} bytes is below node {graph.nodes[node].name}'s footprint "
            f"(output and inputs) of {footprint:,} bytes"
        )
    runtime = _Runtime(DtrGraph.build(graph, costs, pin_sources), ram_bytes, runtime_budget_s, heuristic)
    for t in range(graph.n_nodes):
        runtime.stage = t
        runtime.materialize(t)
        runtime.release_dead()
    return Schedule(n_nodes=graph.n_nodes, ops=tuple(runtime.ops))


def _plan(graph: TrainingGraph, costs: CostModel, budgets: Budgets, heuristic: str, pin_sources: bool = False) -> Schedule:
    schedule = replay(graph, costs, budgets.ram_bytes, budgets.runtime_s(costs), heuristic, pin_sources)
    return within_budgets(METHOD, schedule, graph, costs, budgets)


def plan(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    """DTR with the paper's h_DTR heuristic (exact evicted neighbourhood)."""
    return _plan(graph, costs, budgets, H_DTR)


def plan_local(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    """DTR with the local heuristic c0 / (m * s), which ignores evicted neighbours."""
    return _plan(graph, costs, budgets, LOCAL)


def plan_pinned(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    """DTR with h_DTR that never evicts the input batch, as the paper never evicts constants."""
    return _plan(graph, costs, budgets, H_DTR, pin_sources=True)

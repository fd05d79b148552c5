"""Chen et al., "Training Deep Nets with Sublinear Memory Cost" (arXiv:1604.06174, 2016).

Split the forward pass into segments at checkpoints; keep only the checkpoints through the forward pass;
in the backward pass recompute one segment at a time from its checkpoint and hold it while the segment's
gradients run. ``sqrt(n)`` places a checkpoint every sqrt(n) candidates; ``greedy`` closes a segment
when its activations exceed a byte budget, and we sweep that budget for the cheapest schedule that fits.

Reproduced as Checkmate (Jain et al., MLSys 2020) defines these baselines: candidates are the articulation
points of the forward graph (nodes every path from input to loss goes through), or every forward node of
the linearised graph (``*_linearized``), and the schedule is Checkmate's S matrix of "checkpoint
ladders" with the fewest recomputations that make it consistent. Two differences, both documented:
Checkmate maps a forward node to its gradient by index symmetry, which is off by one on POET's graphs
(one gradient node fewer than forward nodes), so we derive each segment's backward stages from the
graph's edges; and a checkpoint is held until its last use rather than to the end of the step.
"""

from __future__ import annotations

import math

import numpy as np

from poetlab.planners.baselines.base import Budgets, CannotMeetBudget, PlanOptions
from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.planners.heuristics import minimal_recompute
from poetlab.core.schedule import InvalidScheduleError, Schedule, simulate


def articulation_points(graph: TrainingGraph) -> list[int]:
    """Forward nodes whose removal disconnects the input from the loss (the forward graph taken as
    undirected), in topological order. On a chain every node is one."""
    forward = [i for i in graph.forward_indices]
    forward_set = set(forward)
    edges = [(u, v) for u, v in graph.edges if u in forward_set and v in forward_set]
    neighbours: dict[int, set[int]] = {v: set() for v in forward}
    for u, v in edges:
        neighbours[u].add(v)
        neighbours[v].add(u)
    source, sink = forward[0], forward[-1]
    points = []
    for removed in forward:
        if removed in (source, sink):
            points.append(removed)
            continue
        seen, stack = {source}, [source]
        while stack:
            for w in neighbours[stack.pop()]:
                if w != removed and w not in seen:
                    seen.add(w)
                    stack.append(w)
        if sink not in seen:
            points.append(removed)
    return points


def checkpoint_schedule(graph: TrainingGraph, checkpoints: set[int]) -> Schedule:
    """Checkmate's checkpoint-ladder S for the given checkpoints, with the fewest recomputations."""
    T = graph.n_nodes
    forward = list(graph.forward_indices)
    n_forward = len(forward)
    S = np.zeros((T, T), dtype=bool)
    consumers = graph.consumers
    for u, v in graph.edges:
        S[v, u] = True  # every input is held at the start of its consumer's stage
        if graph.nodes[u].is_backward and graph.nodes[v].is_backward:
            S[u + 1 : v + 1, u] = True  # the gradient chain is never recomputed
    for c in checkpoints:
        last = max(consumers[c], default=c)
        S[c + 1 : last + 1, c] = True
    bounds = sorted(c for c in checkpoints if 0 < c < n_forward)
    for start, end in zip([0, *bounds], [*bounds, n_forward], strict=True):
        segment = np.arange(start, end)
        for t in range(start, min(end + 1, T)):  # forward block: the segment so far
            S[t, segment[segment < t]] = True
        readers = sorted({v for i in segment for v in consumers[i] if graph.nodes[v].is_backward})
        if readers:  # backward ladder: the whole segment while its gradients run
            for t in range(readers[0], readers[-1] + 1):
                S[t, segment[segment < t]] = True
    return Schedule.from_matrices(graph, minimal_recompute(graph, S), S)


def _candidates(graph: TrainingGraph, linearized: bool) -> list[int]:
    return list(graph.forward_indices) if linearized else articulation_points(graph)


def _sqrtn(graph: TrainingGraph, linearized: bool) -> Schedule:
    candidates = _candidates(graph, linearized)
    k = max(1, int(math.sqrt(len(candidates))))
    return checkpoint_schedule(graph, {v for index, v in enumerate(candidates) if (index + 1) % k == 0})


def greedy_checkpoints(graph: TrainingGraph, segment_bytes: float, linearized: bool) -> set[int]:
    """Chen's greedy: walk the forward pass, close a segment at the next candidate once the segment's
    activations exceed ``segment_bytes``."""
    candidates = set(_candidates(graph, linearized))
    checkpoints, running = set(), 0.0
    for v in graph.forward_indices:
        running += graph.nodes[v].output_bytes
        if v in candidates and running > segment_bytes:
            checkpoints.add(v)
            running = 0.0
    return checkpoints


def _greedy(graph: TrainingGraph, costs: CostModel, budgets: Budgets, linearized: bool, method: str) -> Schedule:
    """Sweep the segment size over a geometric grid; the cheapest schedule that fits wins."""
    sizes = graph.output_bytes[list(graph.forward_indices)].astype(float)
    grid = np.geomspace(max(sizes.min(), 1.0), sizes.sum(), 40)
    best: tuple[float, Schedule] | None = None
    smallest_peak = math.inf
    tried: set[frozenset[int]] = set()
    for segment_bytes in grid:
        checkpoints = frozenset(greedy_checkpoints(graph, segment_bytes, linearized))
        if checkpoints in tried:
            continue
        tried.add(checkpoints)
        schedule = checkpoint_schedule(graph, set(checkpoints))
        try:
            sim = simulate(schedule, graph, costs, ram_budget_bytes=budgets.ram_bytes, runtime_budget_s=budgets.runtime_s(costs))
        except InvalidScheduleError:
            smallest_peak = min(smallest_peak, simulate(schedule, graph, costs).peak_ram_bytes)
            continue
        if best is None or sim.energy_j < best[0]:
            best = (sim.energy_j, schedule)
    if best is None:
        raise CannotMeetBudget(
            f"{method}: no segment size fits {int(budgets.ram_bytes):,} bytes within the runtime budget; "
            f"its smallest peak is {int(smallest_peak):,} bytes"
        )
    return best[1]


def plan_sqrtn(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    return _sqrtn(graph, linearized=False)


def plan_sqrtn_linearized(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    return _sqrtn(graph, linearized=True)


def plan_greedy(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    return _greedy(graph, costs, budgets, linearized=False, method="chen_greedy")


def plan_greedy_linearized(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    return _greedy(graph, costs, budgets, linearized=True, method="chen_greedy_linearized")

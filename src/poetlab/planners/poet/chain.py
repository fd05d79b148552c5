"""Chain plans: where a schedule's backward pass rebuilds a chain of forward segments, plan the rebuilds directly.

A forward pass whose tensors form a chain of segments between cut vertices (a forward tensor no forward edge jumps
over: BERT's skip-adds, a ResNet's block outputs) is rebuilt in the backward pass from checkpoints on that chain, as
in Griewank's or rotor's checkpointing of a chain, except that here the RAM each backward stage leaves free is set by
the rest of the schedule. Given a schedule (the seed), :func:`chain_plan` keeps every decision of it but those of
the tensors it recomputes in the backward pass on the chain (the plan's tensors), and re-decides those by a dynamic
program over the cut vertices (docs/solve.md, NOTE 21):

- which cut vertices are held from the forward pass across the peak (the roots; each held to its last use), as the
  forward stages' free RAM allows;
- between two held cut vertices, which segment is rerun from which checkpoint in which backward stage (just in time:
  the first stage that reads the segment), which cut vertices that rerun keeps as further checkpoints, or whether one
  rerun builds all the segments up to the one needed and holds every tensor it makes to its last use (cheap once the
  backward pass has freed enough RAM);

each choice checked against the free RAM of the stages it holds tensors in. The cheapest plan is made into a
schedule (the fewest recomputations that make its holds consistent, as Checkmate's R for a given S) and replayed by
the caller. On bert/m4 at 50% it rebuilds each segment about once where the searches' schedules rebuild several
twice (NOTE 21).
"""

from __future__ import annotations

import functools
import time

import numpy as np

from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph, cut_vertices
from poetlab.core.schedule import Schedule
from poetlab.planners.heuristics import minimal_recompute, stage_peaks

#: the most segments the dynamic program plans (its states grow with their square; the paper graphs have 24-60)
MAX_SEGMENTS = 96


class _Chain:
    """The plan's problem: the chain, its segments' tensors, when the backward pass reads each, and the free RAM."""

    def __init__(self, graph: TrainingGraph, costs: CostModel, ram_bytes: float, R: np.ndarray, S: np.ndarray) -> None:
        T = graph.n_nodes
        self.bytes = graph.output_bytes.astype(float)
        self.energy = np.asarray(costs.recompute_energy_j, dtype=float)
        self.inputs = [sorted(set(node.inputs)) for node in graph.nodes]
        consumers = [sorted(set(c)) for c in graph.consumers]
        self.ok = bool(len(graph.backward_indices))
        if not self.ok:  # (a graph without a backward pass rebuilds nothing)
            return
        self.P = P = min(graph.backward_indices)
        forward = set(graph.forward_indices)
        rebuilt = np.array([x in forward and bool(R[P:, x].any()) for x in range(T)])
        cuts = [c for c in cut_vertices(graph) if c < P]
        # the plan's tensors: rebuilt in the backward pass and joined to a cut vertex through rebuilt tensors
        on_chain = np.zeros(T, dtype=bool)
        on_chain[[c for c in cuts if rebuilt[c]]] = True
        for x in sorted(forward, reverse=True):  # (towards a cut vertex: through a consumer)
            on_chain[x] |= rebuilt[x] and any(on_chain[c] for c in consumers[x] if c in forward)
        for x in sorted(forward):  # (from one: through an input)
            on_chain[x] |= rebuilt[x] and any(on_chain[u] for u in self.inputs[x])
        self.plan = on_chain
        held_after = [c for c in cuts if c > max(np.flatnonzero(on_chain), default=-1)]
        self.ok = bool(on_chain.any()) and bool(held_after)
        if not self.ok:
            return
        self.chain = [c for c in cuts if c < held_after[0]] + [held_after[0]]
        n = len(self.chain) - 1
        self.first_read = {x: min((c for c in consumers[x] if c >= P), default=T) for x in range(P) if on_chain[x]}
        self.last_read = {x: max((c for c in consumers[x] if c >= P), default=x) for x in range(P) if on_chain[x]}
        self.last_forward_read = {x: max((c for c in consumers[x] if c < P), default=x) for x in range(P) if on_chain[x]}
        self.seg = {k: [x for x in range(self.chain[k - 1] + 1, self.chain[k] + 1) if on_chain[x]] for k in range(1, n + 1)}
        # the first backward stage that reads a tensor of segment k: where a rerun for it must be done (a cut vertex
        # no backward node reads, as in a traced attention block or GRU, leaves its segment's rerun stage undefined: no plan)
        read = [min((c for c in consumers[cut] if c >= P), default=None) for cut in self.chain]
        self.ok = all(stage is not None for stage in read[1:])
        if not self.ok:
            return
        self.b = {k: min([self.first_read[x] for x in self.seg[k]] + [read[k]]) for k in range(1, n + 1)}
        # the seed without the plan's tensors from their last forward read on: what the rest of it leaves free
        S1, R1 = S.copy(), R.copy()
        for x in np.flatnonzero(on_chain):
            S1[self.last_forward_read[x] + 1 :, x] = False
            R1[P:, x] = False
        self.free = ram_bytes - stage_peaks(graph, R1, S1)
        self.S_base = S1
        self.n = n

    def needed(self, targets: list[int], source: int) -> set[int]:
        """The plan's tensors a rerun from the cut vertex ``source`` computes to make ``targets`` (the rest is held)."""
        need, stack = set(), list(targets)
        while stack:
            x = stack.pop()
            if x in need or x == source or not self.plan[x]:
                continue
            need.add(x)
            stack.extend(self.inputs[x])
        return need

    def fits(self, first: int, held: float, ck_bytes: float, ck_last: int, tensors: list[int]) -> bool:
        """Whether ``held`` bytes, the cut vertex above (to ``ck_last``) and ``tensors`` made at stage ``first`` and each
        held to its last read fit every stage from ``first`` on."""
        last = max([self.last_read[x] for x in tensors] + [first])
        for t in range(first, last + 1):
            used = held + (ck_bytes if t <= ck_last else 0.0) + sum(self.bytes[x] for x in tensors if t <= self.last_read[x])
            if used > self.free[t] + 1e-6:
                return False
        return True


def _solve(chain: _Chain, deadline: float):
    """The dynamic program: (rerun energy, steps) of the cheapest plan, or None. ``F(j, k, hk, H)``: rebuild segments
    j+1..k with cut vertex j held, cut vertex k held (to its last read) where ``hk``, and ``H`` bytes held below."""
    chain_at, b, seg, nbytes = chain.chain, chain.b, chain.seg, chain.bytes

    def cost(need: set[int]) -> float:
        return float(sum(chain.energy[x] for x in need))

    @functools.lru_cache(maxsize=None)
    def F(j: int, k: int, hk: bool, H: float):
        if time.perf_counter() > deadline:
            raise TimeoutError
        cj, ck = chain_at[j], chain_at[k]
        ck_held = hk and bool(chain.plan[ck])
        ck_bytes, ck_last = (nbytes[ck], chain.last_read[ck]) if ck_held else (0.0, -1)
        best = (np.inf, ())
        # rerun segment k from cut vertex j just in time, then the segments below (cut vertex k-1 not held)
        targets = [x for x in seg[k] if not (x == ck and ck_held)]
        need = chain.needed(targets, cj)
        if not targets or chain.fits(b[k], H, ck_bytes, ck_last, targets):
            below = (0.0, ()) if k == j + 1 else F(j, k - 1, False, H)
            best = (cost(need) + below[0], (("rerun", b[k], tuple(targets)),) + below[1])
        # one rerun from cut vertex j that holds every tensor of segments j+1..k to its last read
        if k > j + 1:
            targets = [x for kk in range(j + 1, k + 1) for x in seg[kk] if not (x == ck and ck_held)]
            need = chain.needed(targets, cj)
            if cost(need) < best[0] and chain.fits(b[k], H, ck_bytes, ck_last, targets):
                best = (cost(need), (("rerun", b[k], tuple(targets)),))
        # a rerun from cut vertex j to cut vertex m, held as a checkpoint from segment k's stage to its last read
        for m in range(j + 1, k):
            cm = chain_at[m]
            if not chain.plan[cm]:
                continue
            sweep = cost(chain.needed([cm], cj))
            if sweep >= best[0] or not chain.fits(b[k], H + nbytes[cm], ck_bytes, ck_last, []):
                continue
            above = F(m, k, hk, H + nbytes[cm])
            if sweep + above[0] >= best[0]:
                continue
            below = F(j, m, True, H)
            if sweep + above[0] + below[0] < best[0]:
                best = (sweep + above[0] + below[0], (("hold", b[k], cm),) + above[1] + below[1])
        return best

    @functools.lru_cache(maxsize=None)
    def G(k: int, H: float):
        """Cut vertex k held from the forward pass (k = 0: none), H the bytes of the roots up to it: the chain above."""
        best = (np.inf, ())
        low = chain_at[k] + 1 if k else 0
        for nxt in range(k + 1, chain.n + 1):
            if nxt < chain.n and not chain.plan[chain_at[nxt]]:
                continue
            top = chain_at[nxt] + 1 if nxt < chain.n else max(chain.P, b[chain.n]) + 1  # (to the top segment's rerun)
            if np.any(H > chain.free[low:top] + 1e-6):  # (the roots below hold these forward stages)
                break
            here = F(k, nxt, True, H)
            if here[0] == np.inf:
                continue
            rest = (0.0, ()) if nxt == chain.n else G(nxt, H + nbytes[chain_at[nxt]])
            root = () if nxt == chain.n else (("root", chain_at[nxt]),)
            if here[0] + rest[0] < best[0]:
                best = (here[0] + rest[0], root + here[1] + rest[1])
        return best

    try:
        found = G(0, 0.0)
    except TimeoutError:
        return None
    return None if found[0] == np.inf else found


def chain_plan(graph: TrainingGraph, costs: CostModel, ram_budget_bytes: float, seed: Schedule, fixed_bytes: int = 0, time_limit_s: float = 2.0) -> Schedule | None:
    """``seed`` with its backward pass's rebuilds of the forward chain re-planned (the module's docstring), or None
    where it rebuilds nothing on a chain, pages, or the plan finds nothing within ``time_limit_s``. Not replayed: the
    caller's simulator decides whether it fits (the plan's RAM check is per stage, not per step)."""
    matrices = seed.matrices().as_dict()
    if any(np.asarray(matrices[name]).any() for name in ("S_SSD", "M_IN", "M_OUT", "S_CMP", "M_CMP", "M_DCMP") if name in matrices):
        return None
    R, S = np.asarray(matrices["R"], dtype=bool), np.asarray(matrices["S_RAM"], dtype=bool)
    chain = _Chain(graph, costs, float(ram_budget_bytes) - fixed_bytes, R, S)
    if not chain.ok or chain.n > MAX_SEGMENTS:
        return None
    found = _solve(chain, time.perf_counter() + time_limit_s)
    if found is None:
        return None
    S_new = chain.S_base.copy()
    for step in found[1]:
        if step[0] == "root":
            c = step[1]
            S_new[c + 1 : chain.last_read[c] + 1, c] = True
        elif step[0] == "hold":
            _, stage, c = step
            S_new[stage + 1 : chain.last_read[c] + 1, c] = True
        else:
            _, stage, targets = step
            for x in targets:
                S_new[stage + 1 : chain.last_read[x] + 1, x] = True
    return Schedule.from_matrices(graph, minimal_recompute(graph, S_new), S_new)

"""Beaumont, Eyraud-Dubois & Shilova, "Efficient Combination of Rematerialization and Offloading for
Training DNNs" (NeurIPS 2021): POFO, a dynamic program over a chain that decides, for every activation,
whether to keep it, recompute it or offload it, with the transfers overlapping the computations.

Objectives (``solve_pofo(..., objective=...)``): ``time``, POFO as published (method ``pofo_time``):
the step time, a recomputation costing its runtime and a page the part of its transfer time (latency
plus bytes over the platform's bandwidth) that the computations beside it do not hide; ``time_serial``,
the same with every transfer charged in full (POET's serial model, kept to show what overlap changes);
and ``energy``, the kit's adaptation (method ``pofo``, described below).

POFO's transfer model, as its authors' code (the paper's supplement, ported to ColossalAI as
``colossalai/fx/passes/algorithms/ckpt_solver_pofo.py``; the paper's own text was not at hand) states it:
offloads run during forward computations and prefetches during backward ones, at one bandwidth; data
still being offloaded, and data being prefetched, count in memory; where the memory would overflow,
the processor waits for the channel (the "idle time"); the objective is compute time plus those waits.
This DP prices a page that way on its own recursion: state ``a``'s page-out runs beside the advance to
the split point ``k`` and holds ``a``'s memory until it ends (through the whole advance, through its
first step, or not at all, the processor then waiting for it: the cheapest that fits); its page-in runs
beside the backward nodes of step ``k + 1`` when ``a`` fits beside that reversal's peak, else it is
waited for. A taped split pays its transfers in full. These windows never hold two transfers, so the
channel is never shared in the price. The schedule is then replayed by
:func:`~poetlab.core.schedule.simulate` (serial ``runtime_s``, peak) and timed with transfers beside
compute by :mod:`poetlab.core.overlap`, its transfers issued for overlap
(:mod:`poetlab.planners.transfer_order`), like every method's (docs/solving.md); the replay may hide
more than the DP's windows (measured at or below the DP's price on Table 3's budgets).

Reproduced: their dynamic program over a chain (the rotor/revolve recursion "advance from the left
state to a split point, reverse the right part, then the left part", over every split point and a
discretised memory budget), extended as POFO extends it by offloading: while the right part runs, the
left state is kept in RAM, paged out to flash (once: a tensor already on flash is just dropped) and
paged back in, or, for a source node such as the input, dropped and recomputed; a step's tape (the
interior of a block) may be kept from the advance. Adapted to the kit's cost model: the objective is
energy (recomputation energy plus page-in and page-out energy) instead of makespan; paging time does
not count, as in the POET release, whose runtime budget counts compute only (POFO's "transfers overlap
compute", taken to the limit); memory is discretised into slots of the gcd of the tensor sizes, which
is exact, unless the tables would then exceed ``MAX_CELLS``, when slots are coarser and every size is
rounded up (safe, possibly above the optimum; where that grid finds no plan, a few slots of slack are
added, ``SLACK_SLOTS``, and the first plan that replays within the true budget in bytes is kept, so the
rounding does not turn a budget POFO can meet into "no schedule"); and a runtime budget is met by a Lagrangian sweep
(recomputing costs ``energy + lambda * runtime``, over ``LAMBDAS`` then a bisection; the cheapest plan
that fits wins), which can miss optima that no weight reaches. Every schedule is replayed by
:func:`~poetlab.core.schedule.simulate` before it is returned. Not reproduced: POFO's own recursion
(its states carry the bytes still to offload and to prefetch; this DP keeps the kit's recursion and
prices each page by its windows), and a runtime budget read with overlap (it is checked on the
simulator's serial time, as for every method).

Against the POET MILP: POFO's schedules follow the MILP's stage rules (a recomputation in the stage of
the backward node it serves, a page-out at the start of a stage in which the tensor is resident, a
page-in at the end of a stage after the one that freed the tensor, frees after the last reader), so
each is a feasible point of the MILP with the same objective (tested) and POFO is never below the
MILP's true optimum. Measured on chains of 4, 6 and 8 ReLUs, the tests' ``mlp`` and the paper's
``linear`` model, A72 and M0 costs, five budgets from 75% of checkpoint-all's peak down to the smallest
footprint: equal to the MILP's optimum within 1e-12 in 50 of 50 cases without a runtime budget, and in
116 of 120 with runtime budgets of 1.0x to 1.3x; the four others have a 1.05x budget between two
Lagrangian plans (POFO 17% to 35% above). Two cautions. ``poetlab.solve`` itself stopped above the
optimum on 6 of those 50 A72 cases (by up to 7%): A72 node energies (~1e-7 J) and runtimes (~1e-7 s)
fall below the solvers' tolerances, and the same MILP with its objective in units of one plain step
gives POFO's value, so compare with a scaled objective there. And POFO can be above the optimum by
design, since the MILP may also drop a checkpoint and recompute it later (POFO's checkpoints persist
until their left part is reversed, as in the paper), page out a tensor recomputed within a stage one
stage later (POFO pages only states resident at a stage start), page or recompute any activation rather
than only the states of its recursion, and, on branchy graphs, schedule inside a block.

Branchy graphs (ResNets, BERT) are linearised as in :mod:`poetlab.planners.baselines.revolve`: the states are
the articulation points of the forward graph that no edge jumps over, the nodes between two of them
are one step, advanced as a whole and recomputed as a whole (or kept as its tape) for its backward
nodes. A graph that is not such a chain of blocks raises :class:`CannotMeetBudget`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import reduce

import numpy as np

from poetlab.planners.baselines.base import Budgets, CannotMeetBudget, PlanOptions
from poetlab.planners.baselines.revolve import (
    BlockChain,
    Hold,
    Reversal,
    fragment_peak,
    planning_chain,
    reversal_events,
    schedule_from_events,
)
from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph
from poetlab.errors import InvalidArgumentError
from poetlab.core.overlap import overlapped_timing
from poetlab.core.schedule import InvalidScheduleError, Schedule, SimulationResult, simulate

#: Cells (pairs of states x modes x memory slots) the DP tables may hold, about 8 bytes each.
MAX_CELLS = 6_000_000
#: Runtime weights of the Lagrangian sweep, in units of (plain-step energy / plain-step runtime).
LAMBDAS = (0.0, 0.25, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0)
#: Halvings of the runtime weight between the last grid weight that breaks the runtime budget and the first that meets it.
BISECTIONS = 12
#: ``time``: POFO as published (transfers beside the computations); ``time_serial``: each transfer at its
#: whole time; ``energy``: the kit's adaptation.
OBJECTIVES = ("time", "time_serial", "energy")


class Mode(enum.IntEnum):
    """Where the left state of a reversal is when the reversal starts."""

    FRESH = 0  # just recomputed in this stage: it cannot be paged out in this stage (MILP rule)
    RESIDENT = 1  # in RAM since an earlier stage, not on flash
    ON_FLASH = 2  # in RAM, with a copy on flash already


@dataclass(frozen=True)
class Slots:
    """Memory discretisation: ``unit`` bytes per slot, ``budget`` slots available."""

    unit: int
    budget: int

    def of(self, nbytes: float) -> int:
        """Slots that hold ``nbytes`` (rounded up, so that a plan that fits in slots fits in bytes)."""
        return int(math.ceil(nbytes / self.unit))


@dataclass(frozen=True)
class Choice:
    """One way to split a reversal: advance to state ``k``, hold the left state per ``hold``."""

    k: int
    hold: Hold
    tape: bool


@dataclass(frozen=True)
class _Pieces:
    """The prices of a chain's pieces under one cost weighting: sizes and peaks in slots (arrays indexed
    by state 0..L or by step 1..L, index 0 unused), costs in joules (plus the runtime weight)."""

    state: np.ndarray  # slots of each state
    delta: np.ndarray  # slots of the gradient entering the reversal of step j (0 for the last step)
    interior: np.ndarray  # slots of step j's interior
    step_cost: np.ndarray  # cost of computing every node of step j
    interior_cost: np.ndarray  # cost of recomputing step j's interior
    drop: np.ndarray  # peak of advancing through step j, its start state freed after its last read
    keep: np.ndarray  # ... its start state kept
    tape_keep: np.ndarray  # ... keeping its start state and the whole step
    tape_drop: np.ndarray  # ... keeping the whole step only
    base: np.ndarray  # peak of reversing step j, its interior recomputed
    base_taped: np.ndarray  # ... its interior still in RAM
    source: np.ndarray  # state j reads nothing, so it can be recomputed from nothing
    recompute_state: np.ndarray  # cost of recomputing state j
    pagein: np.ndarray  # energy of paging state j in
    pageout: np.ndarray  # energy of paging state j out
    overlap: bool = False  # price a page by the transfer time the computations beside it do not hide
    forward_s: np.ndarray | None = None  # seconds of computing step j's forward nodes (overlap only)
    backward_s: np.ndarray | None = None  # seconds of step j's backward nodes
    pagein_s: np.ndarray | None = None  # seconds of paging state j in
    pageout_s: np.ndarray | None = None  # seconds of paging state j out


def _pieces(graph: TrainingGraph, costs: CostModel, chain: BlockChain, slots: Slots, weight: float, objective: str = "energy") -> _Pieces:
    """``objective``: ``energy`` (joules), ``time`` (seconds, as published: a recomputation costs its
    runtime, a page the part of its transfer time, latency plus bytes over the platform's bandwidth, that
    the computations beside it do not hide) or ``time_serial`` (a page costs its whole transfer time)."""
    if objective not in OBJECTIVES:
        raise InvalidArgumentError(f"pofo: objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    nbytes = graph.output_bytes
    inputs = [set(node.inputs) for node in graph.nodes]
    if objective in ("time", "time_serial"):
        node_cost, pagein, pageout = costs.runtime_s + weight * costs.runtime_s, costs.pagein_time_s, costs.pageout_time_s
    else:
        node_cost, pagein, pageout = costs.compute_energy_j + weight * costs.runtime_s, costs.pagein_energy_j, costs.pageout_energy_j
    L = chain.n_steps

    def peak(resident: set[int], computes: tuple[int, ...], kept: set[int]) -> int:
        return slots.of(fragment_peak(nbytes, inputs, resident, computes, kept))

    per_step: dict[str, list[float]] = {name: [0] for name in (
        "delta", "interior", "step_cost", "interior_cost", "drop", "keep", "tape_keep", "tape_drop", "base", "base_taped")}
    for j in range(1, L + 1):
        step, start, grad = chain.step(j), chain.points[j - 1], chain.delta(j)
        gradient = set() if grad is None else {grad}
        after = {start, step.backward[-1]}
        values = {
            "delta": 0 if grad is None else slots.of(nbytes[grad]),
            "interior": slots.of(sum(int(nbytes[v]) for v in step.interior)),
            "step_cost": float(node_cost[list(step.nodes)].sum()),
            "interior_cost": float(node_cost[list(step.interior)].sum()),
            "drop": peak({start}, step.nodes, {step.end}),
            "keep": peak({start}, step.nodes, {start, step.end}),
            "tape_keep": peak({start}, step.nodes, {start, *step.nodes}),
            "tape_drop": peak({start}, step.nodes, set(step.nodes)),
            "base": peak({start, step.end} | gradient, step.interior + step.backward, after),
            "base_taped": peak({start, *step.nodes} | gradient, step.backward, after),
        }
        for name, value in values.items():
            per_step[name].append(value)
    points = list(chain.points)
    seconds = {}
    if objective == "time":
        steps = [chain.step(j) for j in range(1, L + 1)]
        seconds = dict(
            overlap=True,
            forward_s=np.array([0.0] + [float(costs.runtime_s[list(step.nodes)].sum()) for step in steps]),
            backward_s=np.array([0.0] + [float(costs.runtime_s[list(step.backward)].sum()) for step in steps]),
            pagein_s=np.asarray(costs.pagein_time_s[points], dtype=float),
            pageout_s=np.asarray(costs.pageout_time_s[points], dtype=float),
        )
    return _Pieces(
        **seconds,
        state=np.array([slots.of(nbytes[p]) for p in points], dtype=np.int64),
        source=np.array([not graph.nodes[p].inputs for p in points]),
        recompute_state=np.asarray(node_cost[points], dtype=float),
        pagein=np.asarray(pagein[points], dtype=float),
        pageout=np.asarray(pageout[points], dtype=float),
        **{name: np.array(values) for name, values in per_step.items()},
    )


def _left_mode(hold: Hold, mode: Mode) -> Mode:
    """Where the left state is when the left part starts: recomputed in that stage, paged back in (so on
    flash), or kept (on flash only if it already was)."""
    if hold is Hold.RECOMPUTE:
        return Mode.FRESH
    return Mode.ON_FLASH if hold is Hold.PAGE or mode is Mode.ON_FLASH else Mode.RESIDENT


class _Dp:
    """The DP tables of one chain: ``rev[a, b][mode]`` and ``top[a]`` are arrays over the free memory
    (in slots, 0..S) of the least cost to reverse steps ``a + 1 .. b`` (``top``: to run the forward pass
    from state ``a`` on and reverse steps ``a + 1 .. L``), ``inf`` where it does not fit. Costs exclude
    each node's first computation, which every schedule pays once."""

    def __init__(self, chain: BlockChain, pieces: _Pieces, n_slots: int):
        self.chain, self.p, self.S = chain, pieces, n_slots
        self.memory = np.arange(n_slots + 1)
        L = chain.n_steps
        self.rev: dict[tuple[int, int], np.ndarray] = {}
        for a in range(L):
            base = np.where(self.memory >= pieces.base[a + 1], pieces.interior_cost[a + 1], math.inf)
            self.rev[a, a + 1] = np.stack([base] * len(Mode))
        for length in range(2, L + 1):
            for a in range(L - length + 1):
                self.rev[a, a + length] = np.stack([self._best(a, a + length, mode, first=False) for mode in Mode])
        self.top: list[np.ndarray] = [np.zeros(n_slots + 1) for _ in range(L + 1)]
        for a in range(L - 1, -1, -1):
            self.top[a] = self._best(a, L, Mode.RESIDENT, first=True)

    def _best(self, a: int, b: int, mode: Mode, first: bool) -> np.ndarray:
        return np.min(np.vstack([values for _, values in self._families(a, b, mode, first)]), axis=0)

    def _shift(self, values: np.ndarray, held: int) -> np.ndarray:
        """Rows of ``values`` for parts that run while ``held`` more slots are taken: out[m] = values[m - held]."""
        out = np.full(values.shape, math.inf)
        if held <= self.S:
            out[..., held:] = values[..., : self.S + 1 - held]
        return out

    def _families(self, a: int, b: int, mode: Mode, first: bool) -> list[tuple[list[Choice], np.ndarray]]:
        """Every split of a reversal (``first``: of the forward pass and reversal from state ``a``) as
        (choices, cost rows over memory), one row per split point ``k`` per way of holding state ``a``:
        kept, paged (not in the stage it was recomputed in, and never freed and paged back in within one
        stage, which the MILP cannot express), recomputed (sources); or, for ``k = a + 1``, with the tape."""
        p, chain, L = self.p, self.chain, self.chain.n_steps
        ks = list(range(a + 1, (b if first else b - 1) + 1))
        k_arr = np.array(ks)
        resident = 0 if first else int(p.state[b] + p.delta[b])
        advance = np.zeros(len(ks)) if first else np.cumsum(p.step_cost[a + 1 : ks[-1] + 1])
        later = np.concatenate([[0], np.maximum.accumulate(p.drop[a + 2 : ks[-1] + 1])]) if len(ks) > 1 else np.zeros(1)
        need = {
            True: resident + np.maximum(p.keep[a + 1], later + p.state[a]),  # state a kept
            False: resident + np.maximum(p.drop[a + 1], later),  # state a dropped
        }
        if first:
            right = np.vstack([self.top[k] if k < L else np.zeros(self.S + 1) for k in ks])
        else:
            right = np.vstack([self.rev[k, b][Mode.FRESH] for k in ks])
        out_stage = chain.points[a] + 1 if first else chain.first_backward(b)
        # freed in out_stage after its last read there, paged in at the end of the stage before step k's
        # reversal: the MILP needs a stage boundary in between (a page-in makes it resident for the next
        # stage, which forbids freeing it in the page-in's stage)
        pageable = np.array([chain.first_backward(k) - 1 > out_stage for k in ks]) & (mode is not Mode.FRESH)
        holds = [(Hold.KEEP, 0.0, np.ones(len(ks), dtype=bool))]
        if pageable.any():
            holds.append((Hold.PAGE, float(p.pagein[a] + (p.pageout[a] if mode is Mode.RESIDENT else 0.0)), pageable))
        if p.source[a]:
            holds.append((Hold.RECOMPUTE, float(p.recompute_state[a]), np.ones(len(ks), dtype=bool)))
        families = []
        for hold, cost, allowed in holds:
            kept = hold is Hold.KEEP
            left_mode = _left_mode(hold, mode)
            left = np.vstack([self.rev[a, k][left_mode] for k in ks])
            if hold is Hold.PAGE and p.overlap:
                values = self._overlapped_page(a, ks, mode, right + left + advance[:, None], need, resident, later)
            else:
                values = (self._shift(right, int(p.state[a])) if kept else right) + left + (advance + cost)[:, None]
                values[self.memory[None, :] < need[kept][:, None]] = math.inf
            values[~allowed] = math.inf
            families.append(([Choice(k, hold, False) for k in ks], values))
            if p.interior[a + 1] > 0 and allowed[0]:  # k = a + 1 keeping the step's tape
                tape_need = resident + int(p.tape_keep[a + 1] if kept else p.tape_drop[a + 1])
                held = int(p.interior[a + 1]) + (int(p.state[a]) if kept else 0)
                left_taped = np.where(self.memory >= p.base_taped[a + 1], 0.0, math.inf)
                taped = self._shift(right[:1], held) + left_taped + (advance[0] + cost)
                taped[:, self.memory < tape_need] = math.inf
                families.append(([Choice(int(k_arr[0]), hold, True)], taped))
        return families

    def _overlapped_page(self, a: int, ks: list[int], mode: Mode, rows: np.ndarray, need: dict[bool, np.ndarray], resident: int,
                         later: np.ndarray) -> np.ndarray:
        """``rows`` (right part, left part and advance, per split point ``k``) plus what state ``a``'s page
        costs when its transfers run beside the computations (POFO's model; see the module's docstring):

        - the page-out runs beside the advance from state ``a`` to ``k``, and state ``a`` holds its memory
          until the page-out ends: held through the whole advance (its time hides the page-out), through
          the advance's first step only (that step's time hides it), or not at all (freed after its last
          read; the processor then waits for the whole page-out before the free);
        - the page-in runs beside the backward nodes of step ``k + 1``, the right part's last reversal,
          which the memory allows when state ``a`` fits beside that reversal's peak; else it is waited for.

        The cheapest of the page-out's three ways counts at each memory. On this DP's chains no other
        transfer runs in those windows (page-outs beside advances, at most one page-in beside each
        reversal of a step), so the one transfer stream is never shared in the DP's pricing."""
        p, L = self.p, self.chain.n_steps
        k_arr = np.array(ks)
        out_s = float(p.pageout_s[a]) if mode is Mode.RESIDENT else 0.0
        in_s = float(p.pagein_s[a])
        advance_s = np.cumsum(p.forward_s[a + 1 : ks[-1] + 1])
        ways = (
            (np.zeros(len(ks)), need[False]),
            (np.full(len(ks), p.forward_s[a + 1]), resident + np.maximum(p.keep[a + 1], later)),
            (advance_s, need[True]),
        )
        best = np.full(rows.shape, math.inf)
        for hidden_s, needed in ways:
            candidate = rows + np.maximum(0.0, out_s - hidden_s)[:, None]
            candidate[self.memory[None, :] < needed[:, None]] = math.inf
            best = np.minimum(best, candidate)
        has_leaf = k_arr < L
        leaf = np.where(has_leaf, p.state[a] + np.maximum(p.base[np.minimum(k_arr + 1, L)], p.base_taped[np.minimum(k_arr + 1, L)]), self.S + 1)
        hidden_in = np.where(has_leaf, p.backward_s[np.minimum(k_arr + 1, L)], 0.0)
        page_in = np.where(self.memory[None, :] >= leaf[:, None], np.maximum(0.0, in_s - hidden_in)[:, None], in_s)
        return best + page_in

    # ---- reconstruction ----------------------------------------------------------------------------
    def plan(self) -> Reversal | None:
        """The optimal plan with the whole budget, or None if nothing fits."""
        if not math.isfinite(self.top[0][self.S]):
            return None
        return self._plan(0, self.chain.n_steps, Mode.RESIDENT, self.S, first=True)

    def _plan(self, a: int, b: int, mode: Mode, m: int, first: bool) -> Reversal:
        if not first and b == a + 1:
            return Reversal(a, b)
        candidates = [
            (values[row, m], choice) for choices, values in self._families(a, b, mode, first) for row, choice in enumerate(choices)
        ]
        _, choice = min(candidates, key=lambda candidate: candidate[0])
        p, k = self.p, choice.k
        held = (int(p.state[a]) if choice.hold is Hold.KEEP else 0) + (int(p.interior[a + 1]) if choice.tape else 0)
        if first:
            right = self._plan(k, b, Mode.RESIDENT, m - held, first=True) if k < b else None
        else:
            right = self._plan(k, b, Mode.FRESH, m - held, first=False)
        left = Reversal(a, k, taped=True) if choice.tape else self._plan(a, k, _left_mode(choice.hold, mode), m, first=False)
        return Reversal(
            a, b, first=first, k=k, hold=choice.hold, page_out=choice.hold is Hold.PAGE and mode is Mode.RESIDENT,
            tape=choice.tape, right=right, left=left,
        )


def _smallest_need(pieces: _Pieces, slots: Slots) -> int:
    """Bytes every plan of the DP needs at least: the forward pass through the widest step, and the
    reversal of the widest step."""
    reversal = np.minimum(pieces.base[1:], pieces.base_taped[1:])
    return int(max(pieces.drop[1:].max(), reversal.max())) * slots.unit


def memory_slots(graph: TrainingGraph, chain: BlockChain, ram_bytes: float) -> Slots:
    """Slots of the gcd of the tensor sizes (exact) when the tables stay under ``MAX_CELLS``, else
    slots just large enough for that (sizes rounded up: safe, possibly not optimal)."""
    pairs = chain.n_steps * (chain.n_steps + 1) // 2
    most = max(16, MAX_CELLS // (len(Mode) * pairs + chain.n_steps + 1) - 1)
    unit = max(1, reduce(math.gcd, (int(b) for b in graph.output_bytes), 0))
    if ram_bytes / unit > most:
        unit = int(math.ceil(ram_bytes / most))
    return Slots(unit, int(ram_bytes // unit))


@dataclass(frozen=True)
class PofoResult:
    """A POFO plan: its schedule, its simulation and the DP's predicted cost (without first computations)."""

    schedule: Schedule
    simulation: SimulationResult
    predicted_extra: float
    runtime_weight: float
    slots: Slots


#: Slots added to a coarse grid's budget, one after the other, when the DP finds no plan: each size is
#: rounded up to whole slots, so a plan whose true peak fits the budget can need a few slots more than
#: the budget holds. Every plan is replayed against the true budget in bytes, so the slack never lets
#: a schedule above the budget through.
SLACK_SLOTS = (1, 2, 4, 8, 16)


def solve_pofo(graph: TrainingGraph, costs: CostModel, budgets: Budgets, objective: str = "energy") -> PofoResult:
    """Run the DP and replay its schedule; with a runtime budget that the energy-optimal plan breaks,
    sweep the runtime weight (``LAMBDAS``, then ``BISECTIONS`` halvings between the last weight that
    breaks it and the first that meets it) and keep the cheapest plan that meets it. On a coarse memory
    grid (slots larger than the gcd of the sizes) that finds nothing, retry with ``SLACK_SLOTS`` more
    slots, keeping the first plan that replays within the true budget. Raise :class:`CannotMeetBudget`
    when nothing fits. ``objective``: one of ``OBJECTIVES`` (see the module's docstring)."""
    chain = planning_chain("pofo", graph, budgets)
    # no schedule holds more than every tensor at once: a larger budget only coarsens the slots
    slots = memory_slots(graph, chain, min(float(budgets.ram_bytes), float(graph.output_bytes.sum())))
    exact = slots.unit == max(1, reduce(math.gcd, (int(b) for b in graph.output_bytes), 0))
    try:
        return solve_on_grid(graph, costs, budgets, chain, slots, objective)
    except CannotMeetBudget as exc:
        if exact:
            raise
        first = exc
    for extra in SLACK_SLOTS:
        try:
            return solve_on_grid(graph, costs, budgets, chain, Slots(slots.unit, slots.budget + extra), objective)
        except CannotMeetBudget:
            continue
    raise first


def solve_on_grid(graph: TrainingGraph, costs: CostModel, budgets: Budgets, chain: BlockChain, slots: Slots, objective: str) -> PofoResult:
    """:func:`solve_pofo` on one memory grid."""
    runtime_s = budgets.runtime_s(costs)
    if objective in ("time", "time_serial"):
        scale = 1.0  # the weight multiplies compute time, already in the objective's unit
    else:
        scale = costs.plain_step_energy_j / costs.plain_step_runtime_s if costs.plain_step_runtime_s > 0 else 0.0

    def attempt(lam: float) -> PofoResult | str:
        """The plan for runtime weight ``lam``, or why it does not fit."""
        dp = _Dp(chain, _pieces(graph, costs, chain, slots, lam * scale, objective), slots.budget)
        plan_ = dp.plan()
        if plan_ is None:
            need = _smallest_need(dp.p, slots)
            why = f"its widest step alone needs {need:,} bytes" if need > budgets.ram_bytes else "no combination of its choices fits"
            raise CannotMeetBudget(f"pofo: no plan of the chain DP fits {int(budgets.ram_bytes):,} bytes ({why})")
        schedule = schedule_from_events(graph, reversal_events(chain, plan_))
        try:
            sim = simulate(schedule, graph, costs, ram_budget_bytes=budgets.ram_bytes, runtime_budget_s=runtime_s)
        except InvalidScheduleError as exc:
            if simulate(schedule, graph, costs).peak_ram_bytes > budgets.ram_bytes:  # a slack grid's plan above the true budget
                raise CannotMeetBudget(f"pofo: the chain DP's plan on this grid exceeds {int(budgets.ram_bytes):,} bytes") from exc
            return exc.reason
        return PofoResult(schedule, sim, float(dp.top[0][slots.budget]), lam * scale, slots)

    failed, reason = 0.0, ""
    for lam in LAMBDAS if runtime_s is not None else LAMBDAS[:1]:
        result = attempt(lam)
        if isinstance(result, PofoResult):
            break
        failed, reason = lam, result
    else:
        raise CannotMeetBudget(f"pofo: no plan meets the runtime budget ({reason})")
    if lam == 0.0:
        return result
    def cost(found: PofoResult) -> float:
        if objective == "time":
            return overlapped_timing(found.schedule, graph, costs, found.simulation).runtime_s
        return found.simulation.runtime_s if objective == "time_serial" else found.simulation.energy_j

    best, fits = result, lam
    for _ in range(BISECTIONS):
        middle = (failed + fits) / 2
        found = attempt(middle)
        if isinstance(found, PofoResult):
            fits = middle
            if cost(found) < cost(best):
                best = found
        else:
            failed = middle
    return best


def plan(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    """POFO's DP with the kit's energy objective, for ``budgets``; ``options`` (time limit, threads) do
    not apply to the DP."""
    return solve_pofo(graph, costs, budgets).schedule


def plan_time(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    """POFO as published: the schedule of least step time (compute plus the transfer time, at the
    platform's bandwidth and latency, that the computations beside it do not hide), within ``budgets``."""
    return solve_pofo(graph, costs, budgets, objective="time").schedule

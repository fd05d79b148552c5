"""Griewank & Walther, "Algorithm 799: revolve: an implementation of checkpointing for the reverse or
adjoint mode of computational differentiation" (ACM TOMS 26(1), 2000): binomial checkpointing.

Revolve reverses a chain of ``l`` steps with ``c`` checkpoint slots (the slot of the initial state
included) and the fewest forward steps: split the range at the binomially optimal point, advance to it,
take a checkpoint there, reverse the right part with one slot fewer, then restore the left checkpoint
and reverse the left part. The number of forward steps is ``p(l, c) = t * l - beta(c + 1, t - 1)`` with
``beta(c, t) = C(c + t, c)`` and ``t`` the smallest integer with ``beta(c, t) >= l`` (G&W's
Proposition 1; ``numforw`` in their code). It counts every *advance*, the initial sweep from the
first state to the last-but-one included, and not the step each adjoint re-executes with taping.

Reproduced here (our own implementation, no third-party package) on the kit's training graphs: the
chain's states are the forward tensors, step ``j`` computes state ``j`` from state ``j - 1``, and its
adjoint is the backward node that reads both (POET's graphs mirror every consecutive pair of layers).
Because that node reads the step's *output* too, the taping re-execution of revolve is replaced by
holding the state that the previous adjoint just consumed; so on a chain the schedule computes forward
nodes exactly ``p(l, c) + 1`` times (the ``+ 1`` is the loss, computed by the first turn) and recomputes
``p(l, c) - (l - 1)`` of them, zero once ``c + 1 >= l``. The slot count is the largest whose schedule
fits the RAM budget in :func:`~poetlab.core.schedule.simulate` (and the runtime budget, if any). Not
reproduced: revolve's own slot bookkeeping, online/multistage variants, and any cost weighting (revolve
counts steps, so on graphs with unequal layers it minimises recomputed steps, not energy). Graphs whose
forward pass branches (ResNets) are linearised: the articulation points of the forward graph with no
edge jumping over them become the chain's states, the nodes between two of them form one step, and a
step's interior is recomputed as a whole when its adjoint runs (its "taping"), except for the last step,
which the first turn computes once; so revolve pays that re-taping even when memory is plentiful (on
the A72, 1.33x a plain step's energy for ``resnet18_cifar`` and ``bert`` at any budget). A graph that is
not such a chain of blocks raises :class:`CannotMeetBudget`. This module also holds that chain-of-blocks view and the conversion
of a reversal plan to the kit's operations, which :mod:`poetlab.planners.baselines.pofo` shares.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from poetlab.planners.baselines.base import Budgets, CannotMeetBudget, PlanOptions
from poetlab.core.costs import CostModel
from poetlab.core.graph import TrainingGraph, cut_vertices
from poetlab.core.schedule import Op, OpKind, Schedule, simulate


# ---- binomial checkpointing counts ----------------------------------------------------------------
def binomial_beta(c: int, t: int) -> int:
    """``beta(c, t) = C(c + t, c)``: the longest chain ``c`` slots reverse with at most ``t`` advances
    of any one step."""
    return math.comb(c + t, c)


def repetition_number(l: int, c: int) -> int:
    """The smallest ``t`` with ``beta(c, t) >= l``."""
    if l < 1 or c < 1:
        raise ValueError(f"need l >= 1 steps and c >= 1 slots, got l={l}, c={c}")
    t = 0
    while binomial_beta(c, t) < l:
        t += 1
    return t


def revolve_forward_count(l: int, c: int) -> int:
    """Forward steps of the optimal reversal of ``l`` steps with ``c`` slots: ``t l - beta(c + 1, t - 1)``
    (G&W 2000, Proposition 1). Counts the initial sweep (``l - 1`` advances) and the recomputations;
    not the re-execution of each step by its adjoint."""
    if l == 1:
        return 0
    t = repetition_number(l, c)
    return t * l - binomial_beta(c + 1, t - 1)


def _forward_count(l: int, c: int) -> float:
    """:func:`revolve_forward_count` extended to ``c = 0`` (only a single step can be reversed)."""
    if l == 1:
        return 0
    return math.inf if c < 1 else revolve_forward_count(l, c)


def optimal_split(l: int, c: int, count: Callable[[int, int], float] = _forward_count) -> int:
    """How many steps to advance before taking the next checkpoint: the largest ``m`` in ``1..l-1``
    with ``m + p(l - m, c - 1) + p(m, c) = p(l, c)``, the recursion whose optimum the formula gives.
    ``count`` is ``p`` (a memoised one, for callers that split many ranges)."""
    counts = [m + count(l - m, c - 1) + count(m, c) for m in range(1, l)]
    best = min(counts)
    return max(m for m, total in enumerate(counts, start=1) if total == best)


class RevolveSplits:
    """Memoised :func:`optimal_split` and forward counts, for planning many slot counts of one chain."""

    def __init__(self) -> None:
        self._counts: dict[tuple[int, int], float] = {}
        self._splits: dict[tuple[int, int], int] = {}

    def count(self, l: int, c: int) -> float:
        if (l, c) not in self._counts:
            self._counts[l, c] = _forward_count(l, c)
        return self._counts[l, c]

    def split(self, l: int, c: int) -> int:
        if (l, c) not in self._splits:
            self._splits[l, c] = optimal_split(l, c, self.count)
        return self._splits[l, c]


# ---- a training graph as a chain of blocks ---------------------------------------------------------
class NotABlockChain(ValueError):
    """The graph cannot be read as a chain of forward blocks with a chain-shaped backward pass."""


@dataclass(frozen=True)
class ChainStep:
    """One step of the chain: its forward nodes (interior, then the state it ends in) and the backward
    nodes that reverse it, in compute order."""

    nodes: tuple[int, ...]
    backward: tuple[int, ...]

    @property
    def interior(self) -> tuple[int, ...]:
        return self.nodes[:-1]

    @property
    def end(self) -> int:
        return self.nodes[-1]


@dataclass(frozen=True)
class BlockChain:
    """States ``points[0..L]`` (forward nodes) and steps ``1..L`` between them.

    The reversal of step ``j`` needs states ``j - 1`` and ``j``, the step's interior and the gradient
    ``delta(j)`` left by the reversal of step ``j + 1`` (``None`` for the last step, whose first backward
    node reads the loss itself)."""

    points: tuple[int, ...]
    steps: tuple[ChainStep, ...]

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def step(self, j: int) -> ChainStep:
        return self.steps[j - 1]

    def delta(self, j: int) -> int | None:
        return None if j == self.n_steps else self.step(j + 1).backward[-1]

    def first_backward(self, j: int) -> int:
        """The stage in which the reversal of step ``j`` starts: its first backward node's index."""
        return self.step(j).backward[0]

    @property
    def is_plain_chain(self) -> bool:
        return all(not step.interior for step in self.steps)


def planning_chain(method: str, graph: TrainingGraph, budgets: Budgets) -> BlockChain:
    """The chain of blocks a chain planner (revolve, POFO) works on, or :class:`CannotMeetBudget` naming
    ``method`` when ``graph`` is not such a chain or the RAM budget is not a positive number of bytes."""
    try:
        chain = block_chain(graph)
    except NotABlockChain as exc:
        raise CannotMeetBudget(f"{method}: not a chain of blocks ({exc})") from None
    if not budgets.ram_bytes > 0:
        raise CannotMeetBudget(f"{method}: the RAM budget must be a positive number of bytes, got {budgets.ram_bytes!r}")
    return chain


def block_chain(graph: TrainingGraph) -> BlockChain:
    """The chain-of-blocks view of ``graph``; raise :class:`NotABlockChain` with the reason if there is none.

    States are the forward nodes no forward edge jumps over (:func:`~poetlab.core.graph.cut_vertices`; on a chain,
    every forward node). A backward node belongs to the step of the latest forward node it reads, must
    read only that step's nodes and states, and may read only the backward node just before it."""
    forward = list(graph.forward_indices)
    n_forward = len(forward)
    if forward != list(range(n_forward)) or n_forward < 2:
        raise NotABlockChain("the forward nodes must come first, before every backward node")
    points = cut_vertices(graph)  # (each is an articulation point: forward nodes come first, so no other edge crosses it)
    if points[0] != 0 or points[-1] != n_forward - 1:
        raise NotABlockChain("the first and last forward nodes must be states of the chain")
    step_of = {}
    for j, (start, end) in enumerate(zip(points, points[1:]), start=1):
        for v in range(start + 1, end + 1):
            step_of[v] = j
    members: dict[int, list[int]] = {j: [] for j in range(1, len(points))}
    for g in range(n_forward, graph.n_nodes):
        node = graph.nodes[g]
        reads_forward = [i for i in node.inputs if i < n_forward]
        reads_backward = {i for i in node.inputs if i >= n_forward}
        if not reads_forward:
            raise NotABlockChain(f"backward node {node.name} reads no forward tensor")
        j = step_of.get(max(reads_forward))
        if j is None or min(reads_forward) < points[j - 1]:
            raise NotABlockChain(f"backward node {node.name} reads forward tensors of more than one step")
        if reads_backward - {g - 1}:
            raise NotABlockChain(f"backward node {node.name} reads a gradient other than the one just before it")
        members[j].append(g)
    order = [g for j in range(len(points) - 1, 0, -1) for g in members[j]]
    if order != list(range(n_forward, graph.n_nodes)) or any(not members[j] for j in members):
        raise NotABlockChain("the backward pass must reverse the steps one after the other, each at least once")
    steps = tuple(
        ChainStep(tuple(range(points[j - 1] + 1, points[j] + 1)), tuple(members[j])) for j in range(1, len(points))
    )
    return BlockChain(tuple(points), steps)


# ---- reversal plans and their operations -----------------------------------------------------------
class Hold(enum.Enum):
    """What happens to the left state while the right part of a split is reversed."""

    KEEP = "keep"  # stays in RAM
    PAGE = "page"  # paged out (unless already on flash) and freed, paged back in before the left part
    RECOMPUTE = "recompute"  # freed and recomputed from nothing (a source node, such as the input)


@dataclass(frozen=True)
class Reversal:
    """A plan to reverse steps ``a + 1 .. b`` of a :class:`BlockChain`, state ``a`` being available.

    A base case (``k is None``, ``b == a + 1``) recomputes step ``b``'s interior (unless ``taped``: still
    in RAM) and runs its backward nodes. Otherwise advance from state ``a`` to state ``k`` (the first
    computations when ``first``: the forward pass), reverse ``right`` (steps ``k + 1 .. b``; ``None``
    when ``k == b``), restore state ``a`` per ``hold`` and reverse ``left`` (steps ``a + 1 .. k``).
    ``page_out``: state ``a`` is not on flash yet, so ``Hold.PAGE`` writes it out first. ``tape``: the
    interior of step ``k == a + 1`` computed by the advance stays in RAM for ``left``."""

    a: int
    b: int
    first: bool = False
    k: int | None = None
    hold: Hold = Hold.KEEP
    page_out: bool = False
    tape: bool = False
    taped: bool = False
    right: Reversal | None = None
    left: Reversal | None = None


def reversal_events(chain: BlockChain, plan: Reversal) -> list[Op]:
    """The computations and page transfers of ``plan`` (which must start at state 0 with ``first``), in
    order and with their stages, without frees. Stages follow the MILP's: a forward node's first
    computation in its own stage, a recomputation in the stage of the backward node it serves, a
    page-out at the start of a stage in which the tensor is resident, a page-in at the end of the
    stage before the one that reads it."""
    events = [Op(OpKind.COMPUTE, chain.points[0], chain.points[0])]
    _emit(chain, plan, events)
    return events


def _emit(chain: BlockChain, plan: Reversal, out: list[Op]) -> None:
    a, b = plan.a, plan.b
    if plan.k is None:
        stage = chain.first_backward(b)
        if not plan.taped:
            out.extend(Op(OpKind.COMPUTE, v, stage) for v in chain.step(b).interior)
        out.extend(Op(OpKind.COMPUTE, g, g) for g in chain.step(b).backward)
        return
    state = chain.points[a]
    start = state + 1 if plan.first else chain.first_backward(b)
    if plan.hold is Hold.PAGE and plan.page_out:
        out.append(Op(OpKind.PAGE_OUT, state, start))
    for j in range(a + 1, plan.k + 1):
        out.extend(Op(OpKind.COMPUTE, v, v if plan.first else start) for v in chain.step(j).nodes)
    if plan.right is not None:
        _emit(chain, plan.right, out)
    restore = chain.first_backward(plan.k)
    if plan.hold is Hold.PAGE:
        out.append(Op(OpKind.PAGE_IN, state, restore - 1))
    elif plan.hold is Hold.RECOMPUTE:
        out.append(Op(OpKind.COMPUTE, state, restore))
    if plan.left is not None:
        _emit(chain, plan.left, out)


def schedule_from_events(graph: TrainingGraph, events: Sequence[Op]) -> Schedule:
    """Add a free after each tensor's last use (a read by a computation, or its page-out) before it is
    next created (computed or paged in), or right after its creation if nothing uses it: everything not
    needed is freed as soon as possible, as the MILP's free-after-last-use rule does."""
    inputs = [set(node.inputs) for node in graph.nodes]
    free_after: list[list[int]] = [[] for _ in events]
    born: dict[int, int] = {}
    last_use: dict[int, int] = {}

    def close(tensor: int) -> None:
        start = born.pop(tensor)
        free_after[last_use.pop(tensor, start)].append(tensor)

    for index, op in enumerate(events):
        if op.kind is OpKind.COMPUTE:
            for i in inputs[op.node]:
                last_use[i] = index
        elif op.kind is OpKind.PAGE_OUT:
            last_use[op.node] = index
        if op.kind in (OpKind.COMPUTE, OpKind.PAGE_IN):
            if op.node in born:
                close(op.node)
            born[op.node] = index
    for tensor in list(born):
        close(tensor)
    ops: list[Op] = []
    for op, frees in zip(events, free_after, strict=True):
        ops.append(op)
        ops.extend(Op(OpKind.FREE, i, op.stage) for i in sorted(frees))
    return Schedule(graph.n_nodes, tuple(ops))


def fragment_peak(
    nbytes: Sequence[int], inputs: Sequence[Iterable[int]], resident: Iterable[int], computes: Sequence[int], keep: Iterable[int]
) -> int:
    """Peak bytes of computing ``computes`` (distinct nodes) in order from ``resident``, freeing each
    tensor after its last read in the fragment unless it is in ``keep`` (a computed tensor nobody reads
    is freed at once): the simulator's accounting of one piece of a schedule, for planners that price
    pieces separately."""
    keep = set(keep)
    last: dict[int, int] = {}
    for index, v in enumerate(computes):
        for i in inputs[v]:
            last[i] = index
    live = set(resident)
    used = sum(int(nbytes[i]) for i in live)
    peak = used
    for index, v in enumerate(computes):
        if v not in live:
            live.add(v)
            used += int(nbytes[v])
        peak = max(peak, used)
        for i in {*inputs[v], v}:
            if i in live and i not in keep and last.get(i, -1) <= index:
                live.discard(i)
                used -= int(nbytes[i])
    return peak


# ---- revolve -----------------------------------------------------------------------------------------
def revolve_plan(n_steps: int, slots: int, splits: RevolveSplits | None = None) -> Reversal:
    """G&W's optimal reversal of ``n_steps`` steps with ``slots`` checkpoint slots, as a plan whose first
    advances are the forward pass. The last step is computed once, by the first turn (``tape``)."""
    if slots < 1:
        raise ValueError(f"revolve needs at least one checkpoint slot, got {slots}")
    split = (RevolveSplits() if splits is None else splits).split

    def reverse(a: int, b: int, c: int, first: bool) -> Reversal:
        if b - a == 1:
            if first:  # the first turn: the last step's only computation, its tape kept
                return Reversal(a, b, first=True, k=b, tape=True, left=Reversal(a, b, taped=True))
            return Reversal(a, b)
        k = a + split(b - a, c)
        return Reversal(a, b, first=first, k=k, right=reverse(k, b, c - 1, first), left=reverse(a, k, c, False))

    return reverse(0, n_steps, slots, True)


def revolve_schedule(
    graph: TrainingGraph, slots: int, chain: BlockChain | None = None, splits: RevolveSplits | None = None
) -> Schedule:
    """The revolve schedule of ``graph`` with ``slots`` checkpoint slots (see the module docstring)."""
    chain = block_chain(graph) if chain is None else chain
    plan_ = revolve_plan(chain.n_steps, min(slots, chain.n_steps), splits)
    return schedule_from_events(graph, reversal_events(chain, plan_))


def plan(graph: TrainingGraph, costs: CostModel, budgets: Budgets, options: PlanOptions = PlanOptions()) -> Schedule:
    """The revolve schedule with the most slots that fits ``budgets``; slots are tried from ``L`` (the
    number of steps, where nothing is recomputed on a chain) down to 1, each replayed by the simulator.
    ``options`` (time limit, threads) do not apply: revolve is a closed-form schedule."""
    chain = planning_chain("revolve", graph, budgets)
    runtime_s = budgets.runtime_s(costs)
    smallest_peak, fastest = math.inf, math.inf
    splits = RevolveSplits()
    for slots in range(chain.n_steps, 0, -1):
        schedule = revolve_schedule(graph, slots, chain, splits)
        sim = simulate(schedule, graph, costs)
        if sim.peak_ram_bytes > budgets.ram_bytes:
            smallest_peak = min(smallest_peak, sim.peak_ram_bytes)
            continue
        if runtime_s is not None and sim.compute_time_s > runtime_s * (1 + 1e-9):
            fastest = min(fastest, sim.compute_time_s)
            continue
        return schedule
    if math.isfinite(fastest):
        raise CannotMeetBudget(
            f"revolve: every slot count that fits {int(budgets.ram_bytes):,} bytes recomputes too much for the runtime "
            f"budget (at best {fastest / costs.plain_step_runtime_s:.3g}x a plain step, budget {budgets.runtime_factor:g}x)"
        )
    raise CannotMeetBudget(
        f"revolve: no slot count fits {int(budgets.ram_bytes):,} bytes (its smallest peak is {int(smallest_peak):,} bytes)"
    )

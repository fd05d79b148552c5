"""The one schedule format of the kit, and the simulator that validates and costs it.

A :class:`Schedule` is an ordered list of operations on the tensors of a training graph: compute a
node (its output appears in RAM), free a tensor, page a tensor out to flash, page it back in; and,
where the cost model has compression costs, compress a tensor (a compressed copy appears in RAM beside
it), decompress it (the dense tensor appears again) and free the compressed copy. Every
planner (the POET MILP, a baseline, a technique) emits one, and :func:`simulate` replays it from these
semantics alone, independently of whoever produced it: it refuses an invalid schedule with the step and
the reason, and returns the energy, runtime and memory trace. No planner's own objective is trusted.

Operations carry the *stage* they belong to, so that the MILP's matrix view (R, S_RAM, S_SSD, M_IN,
M_OUT: what is computed, kept in RAM, kept on flash, paged in and paged out in each stage) can be
derived from any schedule and built back from it.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from poetlab.core.files import parse_json, read_json_file, write_text_atomic
from poetlab.core.costs import CostModel, check_graph_and_costs, check_number
from poetlab.errors import InvalidArgumentError, PoetlabError, ScheduleFileError
from poetlab.core.graph import MAX_FILE_NODES, TrainingGraph

#: the version of the JSON that :meth:`Schedule.to_json` writes
SCHEDULE_FORMAT_VERSION = 1


class OpKind(enum.Enum):
    COMPUTE = "compute"
    FREE = "free"
    PAGE_OUT = "page_out"
    PAGE_IN = "page_in"
    COMPRESS = "compress"
    DECOMPRESS = "decompress"
    FREE_COMPRESSED = "free_compressed"


@dataclass(frozen=True)
class Op:
    kind: OpKind
    node: int
    stage: int


class InvalidScheduleError(PoetlabError):
    """A schedule that cannot run as written; ``step`` is the index of the offending operation."""

    def __init__(self, step: int, op: Op | None, reason: str):
        self.step = step
        self.op = op
        self.reason = reason
        where = f"step {step} ({op.kind.value} node {op.node}, stage {op.stage})" if op is not None else f"after step {step}"
        super().__init__(f"invalid schedule at {where}: {reason}")


@dataclass(frozen=True)
class ScheduleMatrices:
    """The MILP's view of a schedule: T x T boolean matrices indexed [stage, node].

    ``R`` computes node i in stage t; ``S_RAM`` / ``S_SSD`` hold tensor i in RAM / on flash at the start
    of stage t; ``M_IN`` / ``M_OUT`` page tensor i in / out during stage t. ``S_CMP`` holds tensor i
    compressed (in RAM) at the start of stage t; ``M_CMP`` / ``M_DCMP`` compress / decompress it during
    stage t (None in a view built without them).
    """

    R: np.ndarray
    S_RAM: np.ndarray
    S_SSD: np.ndarray
    M_IN: np.ndarray
    M_OUT: np.ndarray
    S_CMP: np.ndarray | None = None
    M_CMP: np.ndarray | None = None
    M_DCMP: np.ndarray | None = None

    def as_dict(self) -> dict[str, np.ndarray]:
        out = {"R": self.R, "S_RAM": self.S_RAM, "S_SSD": self.S_SSD, "M_IN": self.M_IN, "M_OUT": self.M_OUT}
        if self.S_CMP is not None:
            out.update(S_CMP=self.S_CMP, M_CMP=self.M_CMP, M_DCMP=self.M_DCMP)
        return out


@dataclass(frozen=True)
class Schedule:
    """An ordered list of :class:`Op` over a graph of ``n_nodes`` nodes."""

    n_nodes: int
    ops: tuple[Op, ...]
    #: :attr:`TrainingGraph.fingerprint` of the graph the schedule was planned for, where known (a schedule
    #: file saved with its graph records it; older files and schedules built in memory have None).
    graph_fingerprint: str | None = field(default=None, compare=False)

    def for_graph(self, graph: TrainingGraph) -> Schedule:
        """The same schedule, recording ``graph``'s fingerprint (what :meth:`save` writes)."""
        return replace(self, graph_fingerprint=graph.fingerprint)

    def check_graph(self, graph: TrainingGraph, origin: str = "the schedule") -> None:
        """A one-line :class:`ScheduleFileError` if the schedule records another graph's fingerprint (a
        schedule without one is checked only by replaying it)."""
        if self.graph_fingerprint is not None and self.graph_fingerprint != graph.fingerprint:
            raise ScheduleFileError(
                f"{origin}: planned for another graph (fingerprint {self.graph_fingerprint[:12]}, graph {graph.name!r} "
                f"has {graph.fingerprint[:12]}: its nodes, edges or sizes differ); plan it again for this graph"
            )

    @property
    def n_stages(self) -> int:
        return 1 + max((op.stage for op in self.ops), default=-1)

    def count(self, kind: OpKind) -> int:
        return sum(1 for op in self.ops if op.kind is kind)

    @property
    def n_recomputes(self) -> int:
        """Computations beyond the first of each node."""
        return len(self.recomputed_nodes())

    def to_json(self) -> str:
        """The schedule as JSON: its node count and one ``[kind, node, stage]`` row per operation, so that a
        plan can be kept and run again (a time-limited MILP may return another one on the next solve)."""
        rows = ",\n".join(json.dumps([op.kind.value, op.node, op.stage]) for op in self.ops)
        graph = "" if self.graph_fingerprint is None else f'"graph": {json.dumps(self.graph_fingerprint)}, '
        return f'{{"format": "poetlab.Schedule", "version": {SCHEDULE_FORMAT_VERSION}, {graph}"n_nodes": {self.n_nodes}, "ops": [\n{rows}\n]}}\n'

    @classmethod
    def from_json(cls, text: str, origin: str = "schedule") -> Schedule:
        """The schedule :meth:`to_json` wrote; :class:`ScheduleFileError` names what is wrong with any
        other text. Whether it runs on a graph is :func:`simulate`'s to say."""
        return cls._from_data(parse_json(text, origin, ScheduleFileError), origin)

    @classmethod
    def _from_data(cls, data: object, origin: str) -> Schedule:
        if not isinstance(data, dict) or data.get("format") != "poetlab.Schedule":
            raise ScheduleFileError(f"{origin}: not a poetlab schedule (missing format: poetlab.Schedule)")
        if data.get("version") != SCHEDULE_FORMAT_VERSION:
            raise ScheduleFileError(f"{origin}: schedule format version {data.get('version')!r} is not supported (expected {SCHEDULE_FORMAT_VERSION}); plan it again with this poetlab")
        n_nodes = data.get("n_nodes")
        if type(n_nodes) is int and n_nodes > MAX_FILE_NODES:  # before any op is built (other values: below)
            raise ScheduleFileError(f"{origin}: n_nodes is {n_nodes:,}, more than the {MAX_FILE_NODES:,} a schedule file may hold (poetlab.core.graph.MAX_FILE_NODES)")
        try:
            n_nodes = data["n_nodes"]
            ops = tuple(Op(OpKind(kind), node, stage) for kind, node, stage in data["ops"])
        except (KeyError, TypeError, ValueError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ScheduleFileError(f"{origin}: invalid schedule: {detail}") from None
        numbers = [n_nodes, *(v for op in ops for v in (op.node, op.stage))]
        if any(type(v) is not int or v < 0 for v in numbers) or any(op.node >= n_nodes for op in ops):
            raise ScheduleFileError(f"{origin}: invalid schedule: nodes and stages must be whole numbers from 0, nodes below n_nodes ({n_nodes!r})")
        if any(op.stage >= MAX_FILE_NODES for op in ops):
            raise ScheduleFileError(f"{origin}: a stage number of {max(op.stage for op in ops):,}, more than the {MAX_FILE_NODES:,} stages a schedule file may hold (poetlab.core.graph.MAX_FILE_NODES)")
        fingerprint = data.get("graph")
        if fingerprint is not None and not (isinstance(fingerprint, str) and fingerprint.isalnum() and len(fingerprint) <= 128):
            raise ScheduleFileError(f"{origin}: invalid schedule: field 'graph' must be a graph fingerprint (letters and digits), got {fingerprint!r}")
        return cls(n_nodes, ops, fingerprint)

    def save(self, path: str | os.PathLike[str], graph: TrainingGraph | None = None) -> Path:
        """Write the schedule as JSON, atomically; with ``graph``, recording its fingerprint, so that
        loading it for another graph is refused."""
        schedule = self if graph is None else self.for_graph(graph)
        return write_text_atomic(path, schedule.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str], graph: TrainingGraph | None = None) -> Schedule:
        """The schedule in ``path``; with ``graph``, a one-line ScheduleFileError if the file records another
        graph's fingerprint or another node count."""
        schedule = cls._from_data(read_json_file(path, ScheduleFileError, "schedule"), str(path))
        if graph is not None:
            schedule.check_graph(graph, str(path))
            if schedule.n_nodes != graph.n_nodes:
                raise ScheduleFileError(f"{path}: planned for a graph of {schedule.n_nodes} nodes, graph {graph.name!r} has {graph.n_nodes}; plan it again for this graph")
        return schedule

    def recomputed_nodes(self) -> list[int]:
        """The node of each computation beyond its node's first, in schedule order (what a cost model
        prices as a rerun)."""
        seen: set[int] = set()
        out = []
        for op in self.ops:
            if op.kind is OpKind.COMPUTE:
                if op.node in seen:
                    out.append(op.node)
                seen.add(op.node)
        return out

    def matrices(self) -> ScheduleMatrices:
        """Derive the matrix view by replaying where each tensor lives at each stage start."""
        T = self.n_nodes
        stages = max(self.n_stages, T)
        shape = (stages, T)
        R, S_RAM, S_SSD, M_IN, M_OUT, S_CMP, M_CMP, M_DCMP = (np.zeros(shape, dtype=bool) for _ in range(8))
        in_ram = np.zeros(T, dtype=bool)
        on_flash = np.zeros(T, dtype=bool)
        compressed = np.zeros(T, dtype=bool)
        # what each operation marks in the view, and the state it sets: (matrix or None, state, value)
        effects = {
            OpKind.COMPUTE: (R, in_ram, True),
            OpKind.FREE: (None, in_ram, False),
            OpKind.PAGE_OUT: (M_OUT, on_flash, True),
            OpKind.PAGE_IN: (M_IN, in_ram, True),
            OpKind.COMPRESS: (M_CMP, compressed, True),
            OpKind.DECOMPRESS: (M_DCMP, in_ram, True),
            OpKind.FREE_COMPRESSED: (None, compressed, False),
        }
        current = 0
        S_RAM[0], S_SSD[0] = in_ram, on_flash
        for op in self.ops:
            while current < op.stage:
                current += 1
                S_RAM[current], S_SSD[current], S_CMP[current] = in_ram, on_flash, compressed
            mark, state, value = effects[op.kind]
            if mark is not None:
                mark[op.stage, op.node] = True
            state[op.node] = value
        while current + 1 < stages:
            current += 1
            S_RAM[current], S_SSD[current], S_CMP[current] = in_ram, on_flash, compressed
        return ScheduleMatrices(R, S_RAM, S_SSD, M_IN, M_OUT, S_CMP, M_CMP, M_DCMP)

    @classmethod
    def from_matrices(
        cls,
        graph: TrainingGraph,
        R: np.ndarray,
        S_RAM: np.ndarray,
        S_SSD: np.ndarray | None = None,
        M_IN: np.ndarray | None = None,
        M_OUT: np.ndarray | None = None,
        prefetch: bool = False,
        S_CMP: np.ndarray | None = None,
        M_CMP: np.ndarray | None = None,
        M_DCMP: np.ndarray | None = None,
    ) -> Schedule:
        """Turn the MILP's matrices into operations, stage by stage.

        In stage t: page-outs first (of tensors resident at the stage start); then each node of R[t] in
        order, each followed by freeing the inputs that no later node of the stage reads and that
        S_RAM[t + 1] does not keep (Checkmate's free-after-last-use rule); then every other tensor that
        S_RAM[t + 1] does not keep is freed. Page-ins happen at the end of the stage, after the frees,
        so the tensor is resident from stage t + 1 on (the release's accounting); with ``prefetch`` they
        are issued at the start of the stage instead, overlapping its compute, and hold RAM during it.
        An end-of-stage page-in (or decompress) of a tensor that S_RAM[t + 1] does not keep is dropped:
        a solve stopped at its time limit can leave such waste in its answer, and the MILP does not count
        that tensor in stage t + 1's memory, so carrying it out would cost energy and could break the budget.

        Compression: compresses come first in a stage, beside the page-outs (of tensors resident at the
        stage start); at the end of the stage, compressed copies that S_CMP[t + 1] does not keep are
        freed, then decompresses run (their compressed copy is kept into stage t + 1, as the MILP
        requires, so no moment holds more than the next stage's start).
        """
        T = graph.n_nodes
        R = np.asarray(R, dtype=bool)
        S_RAM = np.asarray(S_RAM, dtype=bool)
        zeros = np.zeros((T, T), dtype=bool)
        S_SSD = zeros if S_SSD is None else np.asarray(S_SSD, dtype=bool)
        M_IN = zeros if M_IN is None else np.asarray(M_IN, dtype=bool)
        M_OUT = zeros if M_OUT is None else np.asarray(M_OUT, dtype=bool)
        S_CMP = zeros if S_CMP is None else np.asarray(S_CMP, dtype=bool)
        M_CMP = zeros if M_CMP is None else np.asarray(M_CMP, dtype=bool)
        M_DCMP = zeros if M_DCMP is None else np.asarray(M_DCMP, dtype=bool)
        compressed = np.zeros(T, dtype=bool)
        inputs = [sorted(set(node.inputs)) for node in graph.nodes]
        ops: list[Op] = []
        resident = np.zeros(T, dtype=bool)
        for t in range(T):
            keep = S_RAM[t + 1] if t + 1 < T else np.zeros(T, dtype=bool)
            ops.extend(Op(OpKind.PAGE_OUT, int(i), t) for i in np.flatnonzero(M_OUT[t]))
            for i in np.flatnonzero(M_CMP[t] & ~compressed):
                ops.append(Op(OpKind.COMPRESS, int(i), t))
                compressed[i] = True
            if prefetch:
                for i in np.flatnonzero(M_IN[t]):
                    ops.append(Op(OpKind.PAGE_IN, int(i), t))
                    resident[i] = True
            computed = np.flatnonzero(R[t])
            last_use: dict[int, int] = {}
            for k in computed:
                for i in inputs[k]:
                    last_use[i] = int(k)
            for k in computed:
                ops.append(Op(OpKind.COMPUTE, int(k), t))
                resident[k] = True
                for i in inputs[k]:
                    if last_use[i] == k and not keep[i] and resident[i] and not (prefetch and M_IN[t, i]):
                        ops.append(Op(OpKind.FREE, int(i), t))
                        resident[i] = False
            for i in np.flatnonzero(resident & ~keep):
                if prefetch and M_IN[t, i]:
                    continue
                ops.append(Op(OpKind.FREE, int(i), t))
                resident[i] = False
            keep_compressed = S_CMP[t + 1] if t + 1 < T else np.zeros(T, dtype=bool)
            for i in np.flatnonzero(compressed & ~keep_compressed & ~M_DCMP[t]):
                ops.append(Op(OpKind.FREE_COMPRESSED, int(i), t))
                compressed[i] = False
            if not prefetch:
                for i in np.flatnonzero(M_IN[t] & keep):
                    ops.append(Op(OpKind.PAGE_IN, int(i), t))
                    resident[i] = True
            for i in np.flatnonzero(M_DCMP[t] & keep & compressed & ~resident):
                ops.append(Op(OpKind.DECOMPRESS, int(i), t))
                resident[i] = True
                if not keep_compressed[i]:
                    ops.append(Op(OpKind.FREE_COMPRESSED, int(i), t))
                    compressed[i] = False
        return cls(n_nodes=T, ops=tuple(ops))


def checkpoint_all_schedule(graph: TrainingGraph) -> Schedule:
    """Compute every node once, in order, keeping each tensor until its last consumer has run.

    The memory-hungry reference point: no recomputation and no paging, so its energy is the energy of
    one plain step, which is a lower bound for every schedule (each node must be computed at least once).
    """
    T = graph.n_nodes
    R = np.eye(T, dtype=bool)
    last_consumer = np.array([max(users, default=i) for i, users in enumerate(graph.consumers)])
    stage = np.arange(T)[:, None]
    node = np.arange(T)[None, :]
    S_RAM = (node < stage) & (last_consumer[None, :] >= stage)
    return Schedule.from_matrices(graph, R, S_RAM)


def managed_nodes(graph: TrainingGraph, schedule: Schedule) -> frozenset[int]:
    """The forward nodes (inputs left out) that ``schedule`` does more with than plain autograd would: it frees
    one while a later operation still reads it, pages or compresses it, or recomputes it; and the bases of
    such a node's views (``metadata["view_of"]``: their memory is the bases'). An executor records such a
    node's storages and keeps them until the schedule frees them; every other forward node is computed once
    and freed after its last use, as PyTorch does by itself (docs/executor.md), and its backward node's
    workspace is :attr:`TrainingGraph.workspace_left_alone`."""
    nodes = graph.nodes
    forward = [not node.is_backward and node.kind != "input" for node in nodes]
    computes: dict[int, list[int]] = {}
    for position, op in enumerate(schedule.ops):
        if op.kind is OpKind.COMPUTE:
            computes.setdefault(op.node, []).append(position)
    last_read = [-1] * len(nodes)
    for j, node in enumerate(nodes):
        last = max(computes.get(j, (-1,)))
        for i in node.inputs:
            last_read[i] = max(last_read[i], last)
    managed: set[int] = set()
    for position, op in enumerate(schedule.ops):
        i = op.node
        if not forward[i]:
            continue
        if op.kind is OpKind.FREE:
            if position < last_read[i]:
                managed.add(i)
        elif op.kind is not OpKind.COMPUTE or len(computes[i]) > 1:
            managed.add(i)
    managed |= {b for i in list(managed) for b in graph.view_bases.get(i, ()) if forward[b]}
    return frozenset(managed)


def left_alone_owners(graph: TrainingGraph, schedule: Schedule, managed: frozenset[int]) -> frozenset[int]:
    """The forward nodes of :attr:`TrainingGraph.workspace_owner` whose backward node gets
    :attr:`TrainingGraph.workspace_left_alone` under ``schedule``: not ``managed`` (:func:`managed_nodes`),
    none of their readers (:attr:`TrainingGraph.workspace_readers`) computed twice, since an executor keeps
    a rerun's inputs until the schedule frees them."""
    readers = graph.workspace_readers
    if not readers:
        return frozenset()
    counts = np.bincount([op.node for op in schedule.ops if op.kind is OpKind.COMPUTE], minlength=graph.n_nodes)
    return frozenset(f for f, these in readers.items() if f not in managed and all(counts[j] <= 1 for j in these))


def released_nodes(graph: TrainingGraph, schedule: Schedule, managed: frozenset[int] | None = None) -> frozenset[int]:
    """The nodes of :attr:`TrainingGraph.early_release` whose output tensor goes before their free under
    ``schedule``: left alone (not :func:`managed_nodes`, which a caller that has them may pass), none of their
    tensor readers computed twice (an executor keeps a rerun's inputs until the schedule frees them)."""
    release = graph.early_release
    if not release:
        return frozenset()
    if managed is None:
        managed = managed_nodes(graph, schedule)
    counts = np.bincount([op.node for op in schedule.ops if op.kind is OpKind.COMPUTE], minlength=graph.n_nodes)
    return frozenset(f for f, (_, _, readers) in release.items() if f not in managed and all(counts[j] <= 1 for j in readers))


@dataclass(frozen=True)
class SimulationResult:
    """What replaying a schedule costs. Energies in J, times in s, memory in bytes.

    ``runtime_s`` adds compute, paging and compression time as if they ran one after the other;
    ``compute_time_s`` is what the release's runtime budget counts (compression time, being processor
    work, is added to it in the budget check). ``energy_j`` includes ``compression_energy_j``. ``memory_trace_bytes[k]`` is the
    RAM in use right after operation k (before any free that follows it), fixed bytes included; for a compute,
    the node's workspace too (:attr:`TrainingGraph.workspace`: allocated beside its inputs and output while it
    runs, 0 on the paper's graphs; :attr:`TrainingGraph.workspace_left_alone` for a backward node whose forward
    node the schedule leaves alone, :func:`managed_nodes`).
    """

    energy_j: float
    compute_energy_j: float
    pagein_energy_j: float
    pageout_energy_j: float
    runtime_s: float
    compute_time_s: float
    paging_time_s: float
    peak_ram_bytes: int
    memory_trace_bytes: np.ndarray
    n_computes: int
    n_recomputes: int
    n_pageins: int
    n_pageouts: int
    compression_energy_j: float = 0.0
    compression_time_s: float = 0.0
    n_compresses: int = 0
    n_decompresses: int = 0


def simulate(
    schedule: Schedule,
    graph: TrainingGraph,
    costs: CostModel,
    ram_budget_bytes: float | None = None,
    runtime_budget_s: float | None = None,
    count_paging_time: bool = False,
    fixed_bytes: int = 0,
) -> SimulationResult:
    """Replay ``schedule`` on ``graph`` and return its costs; raise :class:`InvalidScheduleError` if it
    cannot run: a node computed while an input is not in RAM, a free or page-out of a tensor not in RAM,
    a page-in of a tensor never paged out, a compress, decompress or compressed free that the tensor's
    state or the cost model (no compression costs, or not allowed for that node) does not permit, RAM above ``ram_budget_bytes`` (``fixed_bytes``, e.g.
    parameters and gradients, counted in, and a computing node's workspace), a node never computed, or a runtime above
    ``runtime_budget_s`` (compute time, plus paging time when ``count_paging_time``)."""
    check_graph_and_costs("simulate", graph, costs)
    if not isinstance(schedule, Schedule):
        raise InvalidArgumentError(f"simulate: schedule must be a Schedule, got {type(schedule).__name__}")
    check_number("simulate", "ram_budget_bytes", ram_budget_bytes, 0, optional=True)
    check_number("simulate", "runtime_budget_s", runtime_budget_s, 0, optional=True)
    check_number("simulate", "fixed_bytes", fixed_bytes, 0)
    schedule.check_graph(graph)
    T = graph.n_nodes
    if schedule.n_nodes != T or costs.n_nodes != T:
        raise InvalidScheduleError(0, None, f"schedule has {schedule.n_nodes} nodes, graph {T}, costs {costs.n_nodes}")
    nbytes = graph.output_bytes
    workspace = graph.workspace
    owner = graph.workspace_owner
    release = graph.early_release
    managed = managed_nodes(graph, schedule) if (owner >= 0).any() or release else frozenset()
    if (owner >= 0).any():  # (a backward node's workspace is lower where the schedule leaves its forward node alone)
        workspace = np.where((owner >= 0) & np.isin(owner, list(left_alone_owners(graph, schedule, managed))), graph.workspace_left_alone, workspace)
    # (a left-alone node's output tensor goes after its last tensor reader's stage, its saved tensors stay: from
    # the stage after its last tensor reader's to its last reader's, as the MILP's rows count it)
    consumers = graph.consumers
    early = released_nodes(graph, schedule, managed)
    pending = sorted([(release[f][0], f, True) for f in early] + [(max(consumers[f]) + 1, f, False) for f in early])
    released = np.zeros(T, dtype=np.int64)  # bytes of each node already gone
    inputs = [tuple(set(node.inputs)) for node in graph.nodes]
    in_ram = np.zeros(T, dtype=bool)
    on_flash = np.zeros(T, dtype=bool)
    compressed = np.zeros(T, dtype=bool)
    computed = np.zeros(T, dtype=bool)
    pinned = graph.pinned
    compression = costs.compression
    used = int(fixed_bytes)
    compression_energy = compression_time = 0.0
    n_compresses = n_decompresses = 0
    trace = np.empty(len(schedule.ops), dtype=np.int64)
    compute_energy = pagein_energy = pageout_energy = 0.0
    compute_time = paging_time = 0.0
    n_computes = n_pageins = n_pageouts = 0
    last_stage = -1
    for step, op in enumerate(schedule.ops):
        i = op.node
        if not 0 <= i < T:
            raise InvalidScheduleError(step, op, f"node {i} does not exist (graph has {T} nodes)")
        if op.stage < last_stage:
            raise InvalidScheduleError(step, op, f"stage {op.stage} comes after stage {last_stage}")
        last_stage = op.stage
        while pending and pending[0][0] <= op.stage:
            _, f, going = pending.pop(0)
            if in_ram[f]:
                used -= int(release[f][1] if going else -released[f])
                released[f] = release[f][1] if going else 0
        if op.kind is OpKind.COMPUTE:
            if computed[i] and pinned[i]:
                raise InvalidScheduleError(step, op, f"recomputes {graph.nodes[i].name}, which a traced step computes once and holds (a gradient in autograd's engine, or the loss: TrainingGraph.pinned)")
            missing = [j for j in inputs[i] if not in_ram[j]]
            if missing:
                raise InvalidScheduleError(step, op, f"input {graph.nodes[missing[0]].name} (node {missing[0]}) is not in RAM")
            if not in_ram[i]:
                used += int(nbytes[i])
                in_ram[i] = True
            if computed[i]:  # a rerun (priced apart on a profiled host: CostModel)
                compute_energy += costs.recompute_energy_j[i]
                compute_time += costs.recompute_runtime_s[i]
            else:
                compute_energy += costs.compute_energy_j[i]
                compute_time += costs.runtime_s[i]
            computed[i] = True
            n_computes += 1
        elif op.kind is OpKind.FREE:
            if not in_ram[i]:
                raise InvalidScheduleError(step, op, "frees a tensor that is not in RAM")
            in_ram[i] = False
            used -= int(nbytes[i]) - int(released[i])
            released[i] = 0
        elif op.kind is OpKind.PAGE_OUT:
            if not in_ram[i]:
                raise InvalidScheduleError(step, op, "pages out a tensor that is not in RAM")
            if pinned[i]:
                raise InvalidScheduleError(step, op, f"pages out {graph.nodes[i].name}, which a traced step computes once and holds (a gradient in autograd's engine, or the loss: TrainingGraph.pinned)")
            on_flash[i] = True
            pageout_energy += costs.pageout_energy_j[i]
            paging_time += costs.pageout_time_s[i]
            n_pageouts += 1
        elif op.kind in (OpKind.COMPRESS, OpKind.DECOMPRESS, OpKind.FREE_COMPRESSED):
            if compression is None or not compression.allowed[i]:
                why = "the cost model has no compression costs" if compression is None else "compression is not allowed for this node"
                raise InvalidScheduleError(step, op, why)
            if op.kind is OpKind.COMPRESS:
                if not in_ram[i] or compressed[i]:
                    raise InvalidScheduleError(step, op, "compresses a tensor that is not in RAM or is already compressed")
                compressed[i] = True
                used += int(compression.compressed_bytes[i])
                energy, seconds = compression.compress_energy_j, compression.compress_time_s
                n_compresses += 1
            elif op.kind is OpKind.DECOMPRESS:
                if not compressed[i]:
                    raise InvalidScheduleError(step, op, "decompresses a tensor that has no compressed copy")
                used += 0 if in_ram[i] else int(nbytes[i])
                in_ram[i] = True
                energy, seconds = compression.decompress_energy_j, compression.decompress_time_s
                n_decompresses += 1
            else:
                if not compressed[i]:
                    raise InvalidScheduleError(step, op, "frees a compressed copy that does not exist")
                compressed[i] = False
                used -= int(compression.compressed_bytes[i])
                energy = seconds = None
            if energy is not None:
                compression_energy += energy[i]
                compression_time += seconds[i]
        else:
            if not on_flash[i]:
                raise InvalidScheduleError(step, op, "pages in a tensor that was never paged out")
            if not in_ram[i]:
                used += int(nbytes[i])
                in_ram[i] = True
            pagein_energy += costs.pagein_energy_j[i]
            paging_time += costs.pagein_time_s[i]
            n_pageins += 1
        # (a computing node's workspace is in use while it runs, and freed before the next operation)
        now = used + int(workspace[i]) if op.kind is OpKind.COMPUTE else used
        trace[step] = now
        if ram_budget_bytes is not None and now > ram_budget_bytes:
            what = f" ({int(workspace[i]):,} of them the workspace of {graph.nodes[i].name})" if now > used else ""
            raise InvalidScheduleError(step, op, f"RAM in use {now:,} bytes{what} exceeds the budget {int(ram_budget_bytes):,} bytes")
    never = np.flatnonzero(~computed)
    if never.size:
        raise InvalidScheduleError(len(schedule.ops), None, f"node {graph.nodes[never[0]].name} (node {never[0]}) is never computed")
    counted_time = compute_time + compression_time + (paging_time if count_paging_time else 0.0)
    if runtime_budget_s is not None and counted_time > runtime_budget_s * (1 + 1e-9):
        raise InvalidScheduleError(
            len(schedule.ops), None, f"runtime {counted_time:.6g} s exceeds the runtime budget {runtime_budget_s:.6g} s"
        )
    trace.setflags(write=False)
    return SimulationResult(
        energy_j=compute_energy + pagein_energy + pageout_energy + compression_energy,
        compute_energy_j=compute_energy,
        pagein_energy_j=pagein_energy,
        pageout_energy_j=pageout_energy,
        runtime_s=compute_time + paging_time + compression_time,
        compute_time_s=compute_time,
        paging_time_s=paging_time,
        peak_ram_bytes=int(trace.max(initial=fixed_bytes)),
        memory_trace_bytes=trace,
        n_computes=n_computes,
        n_recomputes=n_computes - T,
        n_pageins=n_pageins,
        n_pageouts=n_pageouts,
        compression_energy_j=compression_energy,
        compression_time_s=compression_time,
        n_compresses=n_compresses,
        n_decompresses=n_decompresses,
    )

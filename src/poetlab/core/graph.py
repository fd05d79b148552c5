"""The training graph: the forward and backward nodes of one training step, in topological order.

Every planner (the POET MILP, the baselines, the techniques) reads the same graph: node ``i`` produces
one tensor of ``output_bytes`` bytes with ``flop`` floating-point operations and reads the outputs of
the nodes in ``inputs``. Nodes are stored in a topological order (every input comes earlier), so the
node index doubles as the stage index of the MILP.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from poetlab.core.files import parse_json, read_json_file, write_text_atomic
from poetlab.errors import GraphFileError, InvalidArgumentError

GRAPH_FORMAT_VERSION = 1
#: The most nodes a graph or schedule file may hold, checked before anything is built from it. POET's MILP
#: has O(T²) variables (ResNet-50's 335 nodes already take minutes) and a schedule's matrix view takes
#: 8·T² bytes (800 MB here; a file of 10^6 nodes would ask for 7.3 TiB), while the largest built-in graph
#: (paper ResNet-50) has 335 nodes.
MAX_FILE_NODES = 10_000


@dataclass(frozen=True)
class Node:
    """One operation of a training step and the tensor it produces.

    ``inputs`` lists the indices of the nodes whose outputs this node reads, in the order it reads
    them; an index may repeat (the release's first gradient node reads the loss twice), which is why
    :attr:`TrainingGraph.n_edges` counts references and :attr:`TrainingGraph.n_unique_edges` pairs.
    """

    name: str
    kind: str
    inputs: tuple[int, ...]
    output_shape: tuple[int, ...]
    output_bytes: int
    flop: float
    param_bytes: int = 0
    is_backward: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(int(i) for i in self.inputs))
        object.__setattr__(self, "output_shape", tuple(int(s) for s in self.output_shape))


@dataclass(frozen=True)
class TrainingGraph:
    """A training step as a DAG of :class:`Node` in topological order."""

    name: str
    nodes: tuple[Node, ...]
    metadata: dict[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise InvalidArgumentError(f"training graph {self.name!r} has no nodes")
        names = set()
        for index, node in enumerate(self.nodes):
            if node.name in names:
                raise InvalidArgumentError(f"training graph {self.name!r}: duplicate node name {node.name!r}")
            names.add(node.name)
            for dep in node.inputs:
                if not 0 <= dep < index:
                    raise InvalidArgumentError(
                        f"training graph {self.name!r}: node {index} ({node.name}) reads node {dep}, "
                        "which does not come before it; nodes must be in topological order"
                    )
            if not (node.output_bytes >= 0 and math.isfinite(node.flop) and node.flop >= 0 and node.param_bytes >= 0):
                raise InvalidArgumentError(f"training graph {self.name!r}: node {node.name} has a negative size or flop count")

    @cached_property
    def fingerprint(self) -> str:
        """A digest of what a schedule depends on: the nodes in order with their inputs, output bytes,
        parameter bytes and direction (not names or flop counts: costs are the cost model's). A schedule file
        records it, so that replaying the schedule on another graph is refused."""
        import hashlib

        shape = [[list(node.inputs), node.output_bytes, node.param_bytes, node.is_backward] for node in self.nodes]
        return hashlib.sha256(json.dumps(shape, separators=(",", ":")).encode()).hexdigest()

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_edges(self) -> int:
        """Input references, counting a repeated input once per reference (the release's count)."""
        return sum(len(node.inputs) for node in self.nodes)

    @property
    def n_unique_edges(self) -> int:
        return len(self.edges)

    @cached_property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """Distinct (producer, consumer) pairs, sorted by consumer then producer."""
        return tuple((dep, i) for i, node in enumerate(self.nodes) for dep in sorted(set(node.inputs)))

    @cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the nodes that read its output, in increasing order."""
        users: list[list[int]] = [[] for _ in self.nodes]
        for producer, consumer in self.edges:
            users[producer].append(consumer)
        return tuple(tuple(u) for u in users)

    @property
    def forward_indices(self) -> tuple[int, ...]:
        return tuple(i for i, node in enumerate(self.nodes) if not node.is_backward)

    @property
    def backward_indices(self) -> tuple[int, ...]:
        return tuple(i for i, node in enumerate(self.nodes) if node.is_backward)

    @cached_property
    def pinned(self) -> np.ndarray:
        """Per node, whether every schedule must compute it exactly once and hold it until its last use
        (no recompute, no paging): the gradients of a graph whose backward pass is autograd's
        (``metadata["gradients_in_engine"]``, set by :func:`poetlab.torch.trace`). Autograd's engine holds
        each gradient from the node that makes it to the one that reads it, out of any executor's
        reach, so a plan that pages or recomputes one could not be carried out as planned; and its loss
        node: the step holds the loss it computed to the end of ``loss.backward()``, so a rerun makes a
        second one beside it, with its storage (an MSE's batch-sized buffer, which the graph does not
        count: ``metadata["loss_storage_bytes"]``), and nothing is gained (the loss's backward reads it
        next). (The batch is the caller's: an executor keeps it whatever the plan says, and "recomputing"
        it is a no-op.)"""
        mask = np.zeros(self.n_nodes, dtype=bool)
        if self.metadata.get("gradients_in_engine"):
            mask[list(self.backward_indices)] = True
            mask[[i for i, node in enumerate(self.nodes) if node.kind == "loss"]] = True
        mask.setflags(write=False)
        return mask

    # ---- arrays for planners ------------------------------------------------------------------
    @cached_property
    def output_bytes(self) -> np.ndarray:
        """Output bytes of every node, as a read-only int64 array."""
        return _readonly(np.array([node.output_bytes for node in self.nodes], dtype=np.int64))

    @cached_property
    def flop(self) -> np.ndarray:
        """Flop count of every node, as a read-only float64 array."""
        return _readonly(np.array([node.flop for node in self.nodes], dtype=np.float64))

    @property
    def forward_bytes(self) -> int:
        """Sum of the forward nodes' output bytes (the paper's "forward RAM")."""
        return sum(node.output_bytes for node in self.nodes if not node.is_backward)

    @property
    def param_bytes(self) -> int:
        """Bytes of the step's parameters, each storage once: a traced graph records each node's parameter
        names (``metadata["param_names"]``) and their sizes (``metadata["param_sizes"]``), so a parameter
        that several nodes use (weight tying, a module called twice) counts once; other graphs sum
        ``Node.param_bytes``."""
        names, sizes = self.metadata.get("param_names"), self.metadata.get("param_sizes")
        if isinstance(names, dict) and isinstance(sizes, dict):
            used = {q for node_names in names.values() for q in node_names}
            return int(sum(int(sizes[q]) for q in used if q in sizes))
        return sum(node.param_bytes for node in self.nodes)

    @cached_property
    def workspace(self) -> np.ndarray:
        """Per node, the transient workspace its operation allocates while it computes (forward, rerun or
        backward) and frees before it returns: measured by ``poetlab.torch.trace``
        (``metadata["workspace_by_node"]``, :mod:`poetlab.torch.workspace`), 0 for graphs that do not say
        (the paper's models, whose costs count tensors only). :func:`poetlab.core.schedule.simulate` and
        the POET MILP count node ``i``'s workspace at the moment it computes, beside what is live then."""
        by_name = self.metadata.get("workspace_by_node") or {}
        if not isinstance(by_name, dict):
            raise GraphFileError(f"training graph {self.name!r}: metadata workspace_by_node must map node names to bytes")
        return _readonly(np.array([int(by_name.get(node.name, 0) or 0) for node in self.nodes], dtype=np.int64))

    @cached_property
    def workspace_left_alone(self) -> np.ndarray:
        """Per node, its workspace where the schedule leaves the forward node it belongs to alone (computes it
        once, never pages it, frees it after its last reader: :func:`poetlab.core.schedule.managed_nodes`), at
        most :attr:`workspace`: a backward node whose incoming gradient dies in it
        (``metadata["workspace_left_alone_by_node"]``, :mod:`poetlab.torch.workspace`). Autograd's engine
        frees that gradient once the node's first operation has used it, and frees the tensors the node
        saved as its backward goes, which the lower figure counts on; a managed node's storages stay until
        the schedule frees them, so it gets :attr:`workspace`. Equal to :attr:`workspace` elsewhere."""
        by_name = self.metadata.get("workspace_left_alone_by_node") or {}
        if not isinstance(by_name, dict):
            raise GraphFileError(f"training graph {self.name!r}: metadata workspace_left_alone_by_node must map node names to bytes")
        full = self.workspace
        return _readonly(np.array([min(int(full[i]), int(by_name.get(node.name, full[i]))) for i, node in enumerate(self.nodes)], dtype=np.int64))

    @cached_property
    def view_bases(self) -> dict[int, frozenset[int]]:
        """Per view node, the nodes whose storages its output views (``metadata["view_of"]``, written by
        :func:`poetlab.torch.trace`): it owns none of their memory, which is freed, paged and recomputed with
        them. Empty on the paper's graphs."""
        index = {node.name: i for i, node in enumerate(self.nodes)}
        view_of = self.metadata.get("view_of") or {}
        return {index[v]: frozenset(index[b] for b in bases) for v, bases in view_of.items() if v in index}

    @cached_property
    def early_release(self) -> dict[int, tuple[int, int, tuple[int, ...]]]:
        """Forward node -> (stage, bytes, tensor readers) where its output tensor goes before the storages it
        holds for its own backward: a node whose backward reads only what autograd saved inside it (a dropout's
        mask, BatchNorm's statistics, ``metadata["saved_internal_only"]``), not its output. Where the schedule
        leaves the node alone (:func:`poetlab.core.schedule.managed_nodes`) and reruns none of its tensor
        readers (the nodes that read its output: every consumer but those backward nodes), PyTorch frees the
        output tensor (``bytes``, ``metadata["tensor_bytes"]``) after its last tensor reader, and only the
        saved tensors stay: from ``stage`` (the stage after that reader's) to the node's free, the simulator
        and the MILP count the node's bytes less ``bytes``. Views and their bases are left out (their storages
        are shared). Empty on the paper's graphs."""
        internal_only = self.metadata.get("saved_internal_only") or {}
        tensor_bytes = self.metadata.get("tensor_bytes") or {}
        if not internal_only or not isinstance(internal_only, dict):
            return {}
        index = {node.name: i for i, node in enumerate(self.nodes)}
        only: dict[int, set[int]] = {}
        for reader, names in internal_only.items():
            for name in names:
                only.setdefault(index[name], set()).add(index[reader])
        out: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        for f, readers in sorted(only.items()):
            node = self.nodes[f]
            released = min(int(tensor_bytes.get(node.name, 0) or 0), node.output_bytes)
            tensor_readers = tuple(j for j in self.consumers[f] if j not in readers)
            last = max(tensor_readers, default=f)
            if released > 0 and not node.is_backward and node.kind not in ("input", "loss") and last < max(self.consumers[f], default=f):
                out[f] = (last + 1, released, tensor_readers)
        return out

    @cached_property
    def output_bytes_least(self) -> np.ndarray:
        """Per node, the fewest bytes its output holds in RAM at any stage: :attr:`output_bytes`, less what
        :attr:`early_release` lets go where the schedule leaves the node alone. Lower bounds count these, as
        they count :attr:`workspace_left_alone`: a relaxation of every schedule's memory stays a relaxation,
        where the full bytes could put a bound above a schedule that fits. Equal to :attr:`output_bytes` on
        the paper's graphs."""
        least = np.array(self.output_bytes)
        for f, (_, released, _) in self.early_release.items():
            least[f] -= released
        return _readonly(least)

    @cached_property
    def workspace_owner(self) -> np.ndarray:
        """Per node, the forward node whose treatment picks its workspace (:attr:`workspace_left_alone` where
        the schedule leaves that node alone, :attr:`workspace` otherwise), -1 where both are the same."""
        index = {node.name: i for i, node in enumerate(self.nodes)}
        backward_of = self.metadata.get("backward_of") or {}
        lower = self.workspace_left_alone < self.workspace
        return _readonly(np.array([index[backward_of[node.name]] if lower[i] else -1 for i, node in enumerate(self.nodes)], dtype=np.int64))

    @cached_property
    def workspace_readers(self) -> dict[int, tuple[int, ...]]:
        """Per forward node that picks a backward node's workspace (:attr:`workspace_owner`), the forward nodes
        that read its output or a view of it. The lower figure (:attr:`workspace_left_alone`) counts on that
        output going as the backward node runs, once what the node saved of it goes; an executor keeps a
        rerun's inputs until the schedule frees them, so a rerun of one of these readers keeps it, and the
        backward node gets :attr:`workspace` (as where the schedule manages the node itself)."""
        views = self.view_bases
        out: dict[int, tuple[int, ...]] = {}
        for f in sorted(set(self.workspace_owner[self.workspace_owner >= 0].tolist())):
            holders = [f, *(v for v, bases in views.items() if f in bases)]
            out[f] = tuple(sorted({c for h in holders for c in self.consumers[h] if not self.nodes[c].is_backward} - {f}))
        return out

    @property
    def workspace_bytes(self) -> int:
        """The largest workspace of one operation (:attr:`workspace`): 0 on the paper's graphs."""
        return int(self.workspace.max(initial=0))

    @property
    def reserved_bytes(self) -> int:
        """Bytes held beside the graph's tensors and workspaces that no schedule moves, which
        :func:`poetlab.solve` keeps free for the whole step: the RNG states an executor saves to replay
        dropout in a rerun (``metadata["rng_state_bytes"]``), what the step holds for its loss through the
        whole backward pass (``metadata["loss_storage_bytes"]``: its storage, MSELoss's unreduced buffer, and
        the gradient ``backward()`` seeds it with), and,
        in graphs traced before :mod:`poetlab.torch.gradients` counted them where they live, the gradient
        contributions autograd holds for a parameter that several nodes use
        (``metadata["shared_gradient_bytes"]``); 0 elsewhere. (No margin beside them: with each operation's
        workspace counted while it runs, executed plans measure at or under their simulated peak plus
        these bytes, docs/tracing.md.)"""
        return sum(int(self.metadata.get(key, 0) or 0) for key in ("rng_state_bytes", "loss_storage_bytes", "shared_gradient_bytes"))

    # ---- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        return {
            "format": "poetlab.TrainingGraph",
            "version": GRAPH_FORMAT_VERSION,
            "name": self.name,
            "metadata": dict(self.metadata),
            "nodes": [
                {**asdict(node), "inputs": list(node.inputs), "output_shape": list(node.output_shape)}
                for node in self.nodes
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: object, origin: str = "graph") -> TrainingGraph:
        if not isinstance(data, dict) or data.get("format") != "poetlab.TrainingGraph":
            raise GraphFileError(f"{origin}: not a poetlab training graph (missing format: poetlab.TrainingGraph)")
        if data.get("version") != GRAPH_FORMAT_VERSION:
            raise GraphFileError(
                f"{origin}: graph format version {data.get('version')!r} is not supported (expected {GRAPH_FORMAT_VERSION}); "
                "rebuild the graph with this poetlab"
            )
        try:
            if not isinstance(data["nodes"], list):
                raise GraphFileError(f"{origin}: field 'nodes' must be a list of nodes")
            if len(data["nodes"]) > MAX_FILE_NODES:
                raise GraphFileError(f"{origin}: {len(data['nodes']):,} nodes, more than the {MAX_FILE_NODES:,} a graph file may hold (poetlab.core.graph.MAX_FILE_NODES)")
            nodes = tuple(_node_from_dict(n, f"{origin}: nodes[{i}]") for i, n in enumerate(data["nodes"]))
            metadata = data.get("metadata", {})
            if not isinstance(metadata, dict):
                raise GraphFileError(f"{origin}: field 'metadata' must be a mapping")
            return cls(name=str(data["name"]), nodes=nodes, metadata=dict(metadata))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, GraphFileError):
                raise
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise GraphFileError(f"{origin}: invalid training graph: {detail}") from None

    @classmethod
    def from_json(cls, text: str, origin: str = "graph") -> TrainingGraph:
        return cls.from_dict(parse_json(text, origin, GraphFileError), origin)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the graph as JSON, atomically."""
        return write_text_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TrainingGraph:
        return cls.from_dict(read_json_file(path, GraphFileError, "graph"), str(path))


#: The largest size (bytes) and flop count one node of a graph file may declare: far above any real
#: model, far below where int64 sums or float costs would overflow.
MAX_NODE_BYTES = 2**50
MAX_NODE_FLOP = 1e21


def _node_from_dict(n: object, where: str) -> Node:
    """One node of a graph file, every field checked: a one-line GraphFileError naming the node and field."""
    if not isinstance(n, dict):
        raise GraphFileError(f"{where}: a node must be a mapping, got {type(n).__name__}")

    def whole(key: str, value: object, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value != int(value) or not 0 <= value <= high:
            raise GraphFileError(f"{where}.{key}: must be a whole number between 0 and {high}, got {value!r}")
        return int(value)

    def whole_list(key: str, high: int) -> tuple[int, ...]:
        value = n[key]
        if not isinstance(value, list):
            raise GraphFileError(f"{where}.{key}: must be a list of whole numbers, got {type(value).__name__}")
        return tuple(whole(key, item, high) for item in value)

    flop = n["flop"]
    if isinstance(flop, bool) or not isinstance(flop, int | float) or not (math.isfinite(flop) and 0 <= flop <= MAX_NODE_FLOP):
        raise GraphFileError(f"{where}.flop: must be a finite number between 0 and {MAX_NODE_FLOP:g}, got {flop!r}")
    for key in ("name", "kind"):
        if not isinstance(n[key], str):
            raise GraphFileError(f"{where}.{key}: must be text, got {type(n[key]).__name__}")
    is_backward = n.get("is_backward", False)
    if not isinstance(is_backward, bool):
        raise GraphFileError(f"{where}.is_backward: must be true or false, got {is_backward!r}")
    return Node(
        name=n["name"],
        kind=n["kind"],
        inputs=whole_list("inputs", 2**62),
        output_shape=whole_list("output_shape", MAX_NODE_BYTES),
        output_bytes=whole("output_bytes", n["output_bytes"], MAX_NODE_BYTES),
        flop=flop,
        param_bytes=whole("param_bytes", n.get("param_bytes", 0), MAX_NODE_BYTES),
        is_backward=is_backward,
    )


def min_footprint_bytes(graph: TrainingGraph) -> tuple[int, int]:
    """(bytes, node): the largest output-plus-inputs (plus the node's workspace) of any node, which any schedule
    must hold at once. The workspace is :attr:`TrainingGraph.workspace_left_alone`, the least any schedule
    gets (checkpoint-all's): with :attr:`TrainingGraph.workspace`, a fused group's backward that autograd
    runs after its saved tensors have made room claimed more than checkpoint-all's peak, and a budget that
    checkpoint-all fits was refused as below it."""
    sizes = graph.output_bytes
    workspace = graph.workspace_left_alone
    footprint = np.array([sizes[i] + workspace[i] + sum(int(sizes[j]) for j in set(node.inputs)) for i, node in enumerate(graph.nodes)])
    node = int(footprint.argmax())
    return int(footprint[node]), node


def cut_vertices(graph: TrainingGraph) -> list[int]:
    """The forward tensors no forward edge jumps over, in order: every forward path passes through each of them
    (on a chain, every forward node). The states of a chain of blocks (revolve's, rotor's) and the checkpoints of
    POET's chain plans; one pass over the edges, where a separation search per node would take O(n E)."""
    forward = graph.forward_indices
    covered = np.zeros(graph.n_nodes, dtype=bool)
    for b in forward:
        for a in graph.nodes[b].inputs:
            covered[a + 1 : b] = True
    return [v for v in forward if not covered[v]]


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array

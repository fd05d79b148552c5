"""Graph transformations applied before planning: sparse update, and backward inputs as autograd saves them.

References: J. Lin et al., *On-Device Training Under 256KB Memory*, NeurIPS 2022 (sparse update);
S. G. Patil et al., *POET*, ICML 2022 (the training graphs these transform: the release pairs each layer
with the next and lets the gradient node of a pair (a, b) read both outputs, a and b).

- :func:`sparse_update_graph`: Tiny Training's sparse update seen by the planner. With every layer before
  forward node ``first_trained`` frozen, the backward pass stops there: the gradient nodes of the
  earlier pairs are dropped, so the forward outputs only they read are no longer kept for backward,
  and frozen layers' parameters (which need no gradient buffer and stay in flash, as in the paper) are
  not charged.
- :func:`saved_tensor_graph`: the gradient node of a pair (a, b) reads what PyTorch's autograd saves
  for layer b instead of both outputs: a ReLU saves its output (b), a convolution, linear layer,
  BatchNorm, pooling or loss saves its input(s), a skip add, flatten or dropout saves nothing that is
  another node's output. This is the structure BitTrain exploits (the pre-ReLU convolution output is
  not needed by the backward pass, the sparse ReLU output is), and what a traced graph would have; the
  release's graph keeps both, which makes keeping a ReLU output compressed never better than
  recomputing it from the convolution output that the release's backward reads anyway.
"""

from __future__ import annotations

from poetlab.errors import InvalidArgumentError
from poetlab.graph import Node, TrainingGraph

#: layer kinds whose backward needs their own output / their inputs / neither (PyTorch's saved tensors)
SAVES_OUTPUT = frozenset({"relu"})
SAVES_INPUTS = frozenset({"conv2d", "linear", "batchnorm2d", "maxpool2d", "avgpool2d", "cross_entropy"})
SAVES_NOTHING = frozenset({"skip_add", "flatten", "dropout", "input"})


def _renumbered(graph: TrainingGraph, keep: list[int], name: str, inputs_of, param_bytes_of, metadata: dict[str, object]) -> TrainingGraph:
    new_index = {old: new for new, old in enumerate(keep)}
    nodes = [
        Node(
            name=graph.nodes[old].name,
            kind=graph.nodes[old].kind,
            inputs=tuple(new_index[i] for i in inputs_of(old)),
            output_shape=graph.nodes[old].output_shape,
            output_bytes=graph.nodes[old].output_bytes,
            flop=graph.nodes[old].flop,
            param_bytes=param_bytes_of(old),
            is_backward=graph.nodes[old].is_backward,
        )
        for old in keep
    ]
    return TrainingGraph(name=name, nodes=tuple(nodes), metadata={**graph.metadata, **metadata})


def sparse_update_graph(graph: TrainingGraph, first_trained: int) -> TrainingGraph:
    """``graph`` with every layer before forward node ``first_trained`` frozen: the release's chain of
    gradient nodes stops at the pair (first_trained, first_trained + 1), so the gradient nodes of the
    earlier pairs are dropped. Node order and the forward nodes are kept; indices are renumbered."""
    forward = graph.forward_indices
    if not 0 < first_trained < len(forward):
        raise InvalidArgumentError(f"first trained layer must be a forward node index in 1..{len(forward) - 1}, got {first_trained!r}")
    keep: list[int] = []
    for index, node in enumerate(graph.nodes):
        if node.is_backward:
            # the release names gradient nodes bwd{a}_..., a = the earlier layer of its pair; it reads a
            earlier = min(node.inputs[:2])
            if earlier < first_trained:
                continue
        keep.append(index)
    return _renumbered(
        graph, keep, f"{graph.name}+sparse{first_trained}", lambda old: graph.nodes[old].inputs,
        lambda old: graph.nodes[old].param_bytes if old >= first_trained else 0, {"sparse_update_first_trained": first_trained},
    )


def saved_tensor_graph(graph: TrainingGraph) -> TrainingGraph:
    """``graph`` (a release-style graph: gradient nodes read (a, b, previous gradient)) with each
    gradient node reading the previous gradient and what autograd saves for layer b (see the module
    docstring); a gradient node of an unknown kind keeps the release's inputs."""

    def inputs_of(index: int) -> tuple[int, ...]:
        node = graph.nodes[index]
        if not node.is_backward or len(node.inputs) != 3:
            return node.inputs
        a, b, previous = node.inputs
        kind = graph.nodes[b].kind
        if kind in SAVES_OUTPUT:
            saved: tuple[int, ...] = (b,)
        elif kind in SAVES_INPUTS:
            saved = graph.nodes[b].inputs
        elif kind in SAVES_NOTHING:
            saved = ()
        else:
            return node.inputs
        return tuple(dict.fromkeys((*saved, previous)))

    return _renumbered(
        graph, list(range(graph.n_nodes)), f"{graph.name}+saved", inputs_of, lambda old: graph.nodes[old].param_bytes, {"backward_reads": "saved tensors"}
    )

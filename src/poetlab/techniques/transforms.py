"""Graph transformations applied before planning: sparse update, and backward inputs as autograd saves them.

References: J. Lin et al., *On-Device Training Under 256KB Memory*, NeurIPS 2022 (sparse update);
S. G. Patil et al., *POET*, ICML 2022 (the training graphs these transform: the release pairs each layer
with the next and lets the gradient node of a pair (a, b) read both outputs, a and b).

- :func:`sparse_update_graph`: Tiny Training's sparse update seen by the planner. With every layer before
  forward node ``first_trained`` frozen, the backward pass stops there: the gradient nodes of the
  earlier pairs are dropped, so the forward outputs only they read are no longer kept for backward,
  and frozen layers' parameters (which need no gradient buffer and stay in flash, as in the paper) are
  not charged.
- :func:`scheme_graph`: the same for a real ``nn.Module`` and any Tiny Training scheme (bias-only, last-k,
  chosen layers with channel ratios, full): the module with the scheme applied for real
  (:func:`poetlab.techniques.sparse_update.apply_scheme`), traced by :func:`poetlab.torch.trace`.
- :func:`saved_tensor_graph`: the gradient node of a pair (a, b) reads what PyTorch's autograd saves
  for layer b instead of both outputs: a ReLU saves its output (b), a convolution, linear layer,
  BatchNorm, pooling or loss saves its input(s), a skip add, flatten or dropout saves nothing that is
  another node's output. This is the structure BitTrain exploits (the pre-ReLU convolution output is
  not needed by the backward pass, the sparse ReLU output is), and what a traced graph would have; the
  release's graph keeps both, which makes keeping a ReLU output compressed never better than
  recomputing it from the convolution output that the release's backward reads anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from poetlab.errors import InvalidArgumentError
from poetlab.core.graph import Node, TrainingGraph

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import torch
    from torch import nn

    from poetlab.techniques.sparse_update import SparseUpdateScheme

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
    if graph.metadata.get("source") == "poetlab.torch.trace":
        raise InvalidArgumentError(f"{graph.name} is a traced graph; freeze its layers with scheme_graph (CLI: --sparse-update) instead of first_trained")
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


@dataclass(frozen=True)
class SchemeGraph:
    """A sparse-update scheme made real and seen by the planner: ``module`` is the scheme-applied copy
    (the one to train and to :func:`poetlab.torch.execute` a schedule on), ``graph`` its traced training graph.
    ``trained_param_bytes`` / ``frozen_param_bytes``: the parameters that get a gradient, and the rest."""

    scheme: SparseUpdateScheme
    module: nn.Module
    graph: TrainingGraph
    trained_param_bytes: int
    frozen_param_bytes: int


def scheme_graph(
    module: nn.Module,
    scheme: SparseUpdateScheme,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    loss_fn: Callable[..., torch.Tensor],
    targets: object = None,
    *,
    fuse: bool = False,
    name: str | None = None,
) -> SchemeGraph:
    """Sparse update as a graph transformation of a real model: the training graph POET should plan for
    ``module`` trained under ``scheme``.

    Why trace the transformed module rather than edit a traced graph: :func:`poetlab.torch.trace` takes the
    backward dependencies from what autograd really saves, so the scheme applied for real in PyTorch
    (frozen weights, :class:`~poetlab.techniques.sparse_update._FrozenConv2d` keeping only its weight,
    channel-split convolutions, folded BatchNorm) gives the right graph by construction: layers upstream
    of the first trained one see no tensor that requires grad and get no backward node; a frozen
    convolution on the backward path reads no activation (its backward node keeps only the gradient
    chain); a channel-split layer saves its input once, for the trained slice. An edit of a traced graph
    would have to re-derive each of these from layer kinds, the guesswork the trace exists to avoid, and
    the result would not be executable. The one change made after tracing: a node's ``param_bytes`` (and
    ``metadata["param_names"]``) are its *trained* parameters only, since frozen ones need no gradient
    buffer and, as in the paper, stay in flash; with ``params_in_budget`` the planner charges 2x these.

    The activations run out of place (``apply_scheme(..., inplace_relu=False)``): autograd saves the same
    bytes either way, and one storage per node is what the planner and the executor reason about.
    ``fuse`` is passed to the trace (a fused group keeps its internal saved tensors with its output for
    the whole step, so it over-counts where only an inner tensor is saved; unfused is exact).
    """
    from poetlab.techniques.sparse_update import SparseUpdateScheme, apply_scheme
    from poetlab.torch.trace import trace

    if not isinstance(scheme, SparseUpdateScheme):
        raise InvalidArgumentError(f"scheme must be a SparseUpdateScheme (see poetlab.techniques.sparse_update.parse_scheme), got {type(scheme).__name__}")
    model = apply_scheme(module, scheme, inplace_relu=False)
    base = name or type(module).__name__
    traced = trace(model, example_inputs, loss_fn, targets, fuse=fuse, name=f"{base}+{scheme.name}")
    params = dict(model.named_parameters())
    trained_names: dict[str, list[str]] = {
        node: [q for q in names if params[q].requires_grad] for node, names in traced.metadata["param_names"].items()  # type: ignore[union-attr]
    }

    def nbytes(names: list[str]) -> int:
        return sum(params[q].numel() * params[q].element_size() for q in names)

    nodes = tuple(replace(node, param_bytes=nbytes(trained_names.get(node.name, []))) if not node.is_backward else node for node in traced.nodes)
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    metadata = {**traced.metadata, "param_names": trained_names, "sparse_update_scheme": scheme.name, "frozen_param_bytes": total - trained}
    return SchemeGraph(scheme, model, TrainingGraph(traced.name, nodes, metadata), trained, total - trained)

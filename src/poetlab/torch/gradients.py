"""``poetlab.torch.gradients``: the bytes of a traced step's gradients, as autograd holds them.

A backward node's output is the gradients it returns for its forward node's inputs. The trace counts one
gradient per input that requires grad; two refinements, both measured or read off the graph when tracing,
bring that count to what the allocator sees in a plain step (``tests/torch/test_user_models.py`` compares
checkpoint-all's simulated peak with a plain step's measured one):

- :func:`with_gradient_bytes`: each gradient storage once. An add hands the one gradient it receives to
  both its inputs (a residual connection): counted by input, it was held twice.
- :func:`with_shared_gradients`: a parameter that several nodes use (weight tying, a module called twice)
  gets one gradient contribution from each of their backward nodes, which autograd holds until the last
  arrives and sums them into ``.grad``. The contributions are the graph's now, where and while they live:
  each user's backward node but the last to run holds its contribution in its output until the last
  user's backward node runs (an edge from it to that node), and the last one's contribution is part of
  that node's workspace (summed at once). Before, they were kept free for the whole step
  (``metadata["shared_gradient_bytes"]`` in ``TrainingGraph.reserved_bytes``), the forward pass included,
  where they do not exist.
"""

from __future__ import annotations

from dataclasses import replace

from poetlab.core.graph import TrainingGraph

__all__ = ["with_gradient_bytes", "with_shared_gradients"]

#: forward operations whose output is a view of their input and whose backward hands back a view of the
#: gradient it receives (no new bytes): ``self.encoder.weight.t()`` in weight tying
_VIEW_KINDS = frozenset({"t", "transpose", "permute", "view", "unsqueeze", "squeeze"})


def _views_the_parameter(graph: TrainingGraph, i: int) -> bool:
    """Whether forward node ``i`` is a view of a parameter and nothing else (reads no graph tensor, owns no
    bytes, a view operation): its backward's contribution to the parameter's gradient is a view of the
    gradient its consumers' backward nodes made, not a tensor of its own."""
    node = graph.nodes[i]
    return not node.inputs and node.output_bytes == 0 and node.kind != "input" and set(node.kind.split("+")) <= _VIEW_KINDS


def with_gradient_bytes(graph: TrainingGraph, gradient_bytes: dict[int, int]) -> TrainingGraph:
    """``graph`` with each backward node's bytes lowered to the gradient bytes measured for it, each storage
    once (:class:`poetlab.torch.workspace.OperationBytes`), where those are fewer: never raised above the
    count by input."""
    nodes = tuple(
        replace(node, output_bytes=min(node.output_bytes, gradient_bytes[i])) if i in gradient_bytes else node
        for i, node in enumerate(graph.nodes)
    )
    return TrainingGraph(graph.name, nodes, graph.metadata)


def with_shared_gradients(graph: TrainingGraph) -> TrainingGraph:
    """``graph`` with the gradient contributions of each parameter that several forward nodes use counted
    where autograd holds them (module docstring): the backward nodes of its users but the earliest in the
    forward pass (whose backward runs last) hold one contribution each in their outputs until that node
    runs, and that node's workspace has its own. Reads ``metadata["param_names"]``, ``["param_sizes"]``,
    ``["backward_of"]`` and ``["workspace_by_node"]``; the latter (and ``["workspace_left_alone_by_node"]``) is updated, and
    ``metadata["shared_gradient_bytes"]`` (kept free for the whole step) set to 0."""
    metadata = dict(graph.metadata)
    param_names: dict[str, list[str]] = metadata.get("param_names", {})  # type: ignore[assignment]
    sizes: dict[str, int] = metadata.get("param_sizes", {})  # type: ignore[assignment]
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    backward = {f: index[b] for b, f in metadata.get("backward_of", {}).items()}  # type: ignore[union-attr]
    forward_of = {b: index[f] for f, b in backward.items()}
    users: dict[str, list[int]] = {}
    for name, params in param_names.items():
        if name in backward:
            for q in dict.fromkeys(params):
                users.setdefault(q, []).append(backward[name])
    extra = [0] * graph.n_nodes
    reads: dict[int, set[int]] = {}
    workspace = dict(metadata.get("workspace_by_node") or {})  # type: ignore[arg-type]
    left_alone = dict(metadata.get("workspace_left_alone_by_node") or {})  # type: ignore[arg-type]
    for q, grads in users.items():
        if len(grads) < 2:
            continue
        last = max(grads)  # (backward nodes come in reverse forward order: the earliest user's runs last)
        for j in grads:
            if j != last:
                reads.setdefault(last, set()).add(j)
                if _views_the_parameter(graph, forward_of[j]):
                    # its contribution is the gradient its consumers' backward nodes made (a view of it):
                    # already in their outputs, which are held until the last user's runs
                    reads[last] |= {k for k in graph.nodes[j].inputs if graph.nodes[k].is_backward}
                else:
                    extra[j] += int(sizes.get(q, 0))
        name = graph.nodes[last].name
        workspace[name] = int(workspace.get(name, 0)) + int(sizes.get(q, 0))
        if name in left_alone:
            left_alone[name] = int(left_alone[name]) + int(sizes.get(q, 0))
    nodes = tuple(
        replace(node, output_bytes=node.output_bytes + extra[i], inputs=(*node.inputs, *sorted(reads.get(i, set()) - set(node.inputs))))
        for i, node in enumerate(graph.nodes)
    )
    metadata["workspace_by_node"] = workspace
    if left_alone:
        metadata["workspace_left_alone_by_node"] = left_alone
    metadata["shared_gradient_bytes"] = 0
    return TrainingGraph(graph.name, nodes, metadata)

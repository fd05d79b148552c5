"""Binding a traced graph to its fx nodes, and fx code generated for groups of nodes (the forward pass and reruns run as generated code; BatchNorm's rerun stand-ins, NOTE [3]). See docs/executor.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn

from poetlab.core.graph import TrainingGraph
from poetlab.torch.probes import fetch_attr
from poetlab.torch.execute.result import ExecutionError


# ---- how graph nodes map onto fx ---------------------------------------------------------------


@dataclass(frozen=True)
class Binding:
    """Graph node index -> what to run: ``members`` (fx nodes, in order) for forward nodes, the forward
    node of each backward node, and which nodes are inputs or the loss."""

    members: tuple[tuple[fx.Node, ...], ...]
    forward_of: tuple[int | None, ...]
    backward_of_forward: dict[int, int]
    inputs: frozenset[int]
    loss: int
    output_arg: object  # the fx output node's argument (the model output, fx nodes inside)


def bind_graph(graph: TrainingGraph, gm: fx.GraphModule) -> Binding:
    meta = graph.metadata
    if meta.get("source") != "poetlab.torch.trace":
        raise ExecutionError(f"graph {graph.name!r} was not made by poetlab.torch.trace; execute needs a traced graph (poetlab.torch.trace(module, ...))")
    if meta.get("fx_code") is not None and meta["fx_code"] != gm.code:
        raise ExecutionError(f"graph {graph.name!r} was traced from a different module; trace this module again")
    by_name = {n.name: n for n in gm.graph.nodes}
    groups: dict[str, list[str]] = meta["fx_groups"]  # type: ignore[assignment]
    backward_of: dict[str, str] = meta["backward_of"]  # type: ignore[assignment]
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    members: list[tuple[fx.Node, ...]] = []
    forward_of: list[int | None] = []
    inputs = set()
    for i, node in enumerate(graph.nodes):
        if node.is_backward:
            forward_of.append(index[backward_of[node.name]])
            members.append(())
            continue
        forward_of.append(None)
        try:
            members.append(tuple(by_name[m] for m in groups[node.name]))
        except KeyError as exc:
            raise ExecutionError(f"graph {graph.name!r}: fx node {exc} of {node.name!r} is not in the module's trace; trace this module again") from None
        if node.kind == "input":
            inputs.add(i)
    params = dict(gm.named_parameters())
    for node in graph.nodes:
        names = meta.get("param_names", {}).get(node.name, [])  # type: ignore[union-attr]
        if names and sum(params[q].numel() * params[q].element_size() for q in names if q in params) != node.param_bytes:
            raise ExecutionError(f"graph {graph.name!r} was traced from a module with other parameter shapes ({node.name}); trace this module again")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    return Binding(
        members=tuple(members),
        forward_of=tuple(forward_of),
        backward_of_forward={f: j for j, f in enumerate(forward_of) if f is not None},
        inputs=frozenset(inputs),
        loss=index[str(meta.get("loss_node", "loss"))],
        output_arg=output.args[0],
    )


@dataclass(frozen=True)
class CompiledGroup:
    """A forward node's fx nodes as one generated Python function (``torch.fx`` code generation):
    ``run(*values of deps)`` returns the values of the group's external fx nodes, the output last. It
    runs the very operations, in the same order, that interpreting the fx nodes one by one would, without
    the interpreter's per-node Python work (argument mapping, lookups), which dominated the executor's
    own overhead on models of many small operations. A rerun's code calls its BatchNorm modules through
    :class:`RerunBatchNorm` (their fx targets: ``stand_ins``)."""

    deps: tuple[fx.Node, ...]
    run: Callable[..., tuple[object, ...]]
    stand_ins: frozenset[str] = frozenset()


#: the BatchNorm classes whose reruns :class:`RerunBatchNorm` runs (exactly these: a subclass may do more)
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class RerunBatchNorm:
    """A BatchNorm module as a rerun calls it: in training, the same ``F.batch_norm`` on the same batch
    statistics as its first run (the same bytes out and saved), but with running statistics of its own that
    nothing reads, so the module's running statistics and ``num_batches_tracked`` are updated once a step,
    by the first run, as in a plain step. In eval mode a BatchNorm writes nothing, and the module runs.

    Why: a rerun through the module updates them a second time, which the step then had to undo (before
    the backward pass: the reruns' buffers reset to the step's backup, their versions set back, one copy
    and two calls per buffer, :class:`RerunBuffers`; or copied around each rerun). A module with hooks of its own when the executor is made is called as it is
    (its hooks run on the rerun too, and its buffers are put back as any module's); hooks registered later,
    and global module hooks, do not run on a stand-in's rerun."""

    __slots__ = ("module", "running_mean", "running_var")

    def __init__(self, module: nn.modules.batchnorm._BatchNorm):
        self.module = module
        self.running_mean = torch.zeros_like(module.running_mean)  # type: ignore[arg-type]
        self.running_var = torch.ones_like(module.running_var)  # type: ignore[arg-type]

    @staticmethod
    def applies(module: nn.Module) -> bool:
        """Whether a rerun may call ``module`` through a stand-in: one of :data:`_BATCH_NORMS` exactly that
        tracks running statistics, without hooks of its own (those stay the module's to run)."""
        return (
            type(module) in _BATCH_NORMS and module.track_running_stats  # type: ignore[operator]
            and module.running_mean is not None and module.running_var is not None
            and not (module._forward_hooks or module._forward_pre_hooks)
        )

    def run(self, x: torch.Tensor) -> torch.Tensor:
        bn = self.module
        if not bn.training:
            return bn(x)
        return nn.functional.batch_norm(x, self.running_mean, self.running_var, bn.weight, bn.bias, True, 0.0, bn.eps)


#: the fx node kinds that generated code can run as they are (placeholders read the caller's inputs)
PLAIN_FX_OPS = ("call_module", "call_function", "call_method", "get_attr")


def generated_module(gm: fx.GraphModule, graph: fx.Graph, own: dict[str, object] | None = None) -> fx.GraphModule:
    """``graph`` (whose modules and attributes are ``gm``'s, or ``own``'s where a target is one of its keys)
    as generated code that reaches each module and attribute it uses as one attribute of its own, under a
    flat name. Why: fx's code reaches a submodule by its path (``getattr(getattr(self.features, "1").conv,
    "0")``), one ``Module.__getattr__`` per part, which costs a deep model's forward pass
    a few percent against the model's own code. The modules and tensors are ``gm``'s own objects, not copies."""
    flat: dict[str, str] = {}
    root: dict[str, object] = {}
    for n in graph.nodes:
        if n.op in ("call_module", "get_attr"):
            target = str(n.target)
            if target not in flat:
                name = flat[target] = f"{target.replace('.', '_')}_{len(flat)}"
                root[name] = own[target] if own is not None and target in own else fetch_attr(gm, target)
            n.target = flat[target]
    return fx.GraphModule(root, graph)


def outside_inputs(members: Sequence[fx.Node]) -> dict[str, fx.Node]:
    """The fx nodes that ``members`` read and that are not among them, by name, in order of first read."""
    inside = {m.name for m in members}
    deps: dict[str, fx.Node] = {}
    for m in members:
        for d in m.all_input_nodes:
            if d.name not in inside:
                deps.setdefault(d.name, d)
    return deps


def compile_group(gm: fx.GraphModule, members: tuple[fx.Node, ...], external: tuple[str, ...], rerun: bool = False) -> CompiledGroup | None:
    """The group as a :class:`CompiledGroup` (a rerun's: ``rerun``), or None for one that reads the caller's
    inputs (placeholders stay interpreted) or one without fx nodes (backward nodes). A group of one fx node
    too: interpreted, its arguments go through ``fx.node.map_arg`` and a lookup each (the encoder's layer,
    one module call, ran measurably slower so)."""
    if not members or any(m.op not in PLAIN_FX_OPS for m in members):
        return None
    return group_function(gm, members, external, rerun)


def group_function(gm: fx.GraphModule, members: Sequence[fx.Node], external: Sequence[str], rerun: bool = False) -> CompiledGroup:
    """``members`` as one generated function of the fx nodes they read from outside, returning the values
    of ``external`` (whatever the group's size: :func:`compile_group` decides when it is worth it). A
    rerun's (``rerun``) calls each BatchNorm module that :meth:`RerunBatchNorm.applies` to through a stand-in."""
    deps = outside_inputs(members)
    sub = fx.Graph()
    env: dict[fx.Node, fx.Node] = {d: sub.placeholder(f"dep_{k}") for k, d in enumerate(deps.values())}
    stand_ins: dict[str, object] = {}  # (the stand-in's own fx target -> it)
    replaced: set[str] = set()  # (the BatchNorm modules' targets)
    for m in members:
        if rerun and stands_in(gm, m):
            target = f"{m.target}.rerun"
            stand_ins.setdefault(target, RerunBatchNorm(gm.get_submodule(str(m.target))))  # type: ignore[arg-type]
            replaced.add(str(m.target))
            env[m] = sub.call_method("run", (sub.get_attr(target), env[m.args[0]]))  # type: ignore[index]
        else:
            env[m] = sub.node_copy(m, lambda n: env[n])
    by_name = {m.name: env[m] for m in members}
    sub.output(tuple(by_name[name] for name in external))
    return CompiledGroup(tuple(deps.values()), generated_module(gm, sub, stand_ins).forward, frozenset(replaced))


def stands_in(gm: fx.GraphModule, m: fx.Node) -> bool:
    """Whether a rerun's code calls fx node ``m`` through a :class:`RerunBatchNorm` (a BatchNorm module it
    applies to, called on one value)."""
    return (
        m.op == "call_module" and RerunBatchNorm.applies(gm.get_submodule(str(m.target)))
        and len(m.args) == 1 and isinstance(m.args[0], fx.Node) and not m.kwargs
    )

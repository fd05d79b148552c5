"""``poetlab.torch.probes``: one node of a traced step run alone on its recorded inputs, and the helpers over fx
values that tracing, profiling and executing share.

:func:`poetlab.torch.trace` counts each node's flops with these probes and :mod:`poetlab.torch.profile` times
them; kept apart from the tracer so that the graph building stays one concern.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import fx, nn
from torch.utils.flop_counter import FlopCounterMode

if TYPE_CHECKING:
    from poetlab.torch.trace import TracedStep


def tensors_in(value: object) -> list[torch.Tensor]:
    """The tensors in a value (a tensor, or a tuple/list/dict of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_in(item)]
    return []


def fetch_attr(gm: fx.GraphModule, target: str):
    """The attribute ``target`` (a dotted path, as in a ``get_attr`` node) of ``gm``."""
    value = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def attribute_tensors(gm: fx.GraphModule) -> list[torch.Tensor]:
    """The tensors ``gm``'s ``get_attr`` nodes read (parameters, buffers and fx tensor constants such as
    ``_tensor_constant0``): constants of a step, never a node's storage."""
    found = [fetch_attr(gm, str(n.target)) for n in gm.graph.nodes if n.op == "get_attr"]
    return [t for t in found if isinstance(t, torch.Tensor)]


def group_params(gm: fx.GraphModule, members: list[fx.Node], modules: dict[str, nn.Module]) -> list[nn.Parameter]:
    """Parameters a group uses: its modules' and those read through get_attr, each once."""
    found: dict[int, nn.Parameter] = {}
    for n in members:
        if n.op == "call_module":
            for p in modules[n.target].parameters():
                found.setdefault(id(p), p)
        for dep in n.all_input_nodes:
            if dep.op == "get_attr":
                value = fetch_attr(gm, dep.target)
                if isinstance(value, nn.Parameter):
                    found.setdefault(id(value), value)
    return list(found.values())


def restored_state(module: nn.Module):
    """Context manager: put back parameters, buffers and RNG state as they were."""

    @contextlib.contextmanager
    def manager():
        saved = {k: v.detach().clone() for k, v in module.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)}
        with torch.random.fork_rng(devices=[]):
            try:
                yield
            finally:
                with torch.no_grad():
                    current = module.state_dict(keep_vars=True)
                    for k, v in saved.items():
                        if k in current:
                            current[k].copy_(v)

    return manager()


# ---- running one node alone (flops in poetlab.torch.trace, timings in poetlab.torch.profile) ----------


@dataclass
class NodeProbe:
    """One graph node, ready to run alone on its recorded inputs.

    ``forward()`` computes the node's output from fresh leaf copies of its inputs; ``backward(out)``
    computes the gradients that node's backward computes, w.r.t. the inputs that require grad and the
    node's parameters. A probe for a backward node runs its forward node's forward in ``prepare`` and
    times only the backward.
    """

    forward: Callable[[], object]
    grad_targets: Callable[[], list[torch.Tensor]]
    is_backward: bool

    def run_backward(self, output: object) -> None:
        outs = [t for t in tensors_in(output) if t.requires_grad]
        targets = [t for t in self.grad_targets() if t.requires_grad]
        if not outs or not targets:
            return
        grads = [torch.ones_like(t) for t in outs]
        torch.autograd.grad(outs, targets, grads, allow_unused=True)



_IN_PLACE_FUNCTIONS = frozenset({operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.setitem})


def in_place(n: fx.Node, modules: dict[str, nn.Module]) -> bool:
    """Whether fx node ``n`` writes into one of its inputs (an ``inplace=True`` module or function, an
    augmented assignment, a tensor method ending in ``_``)."""
    if n.op == "call_module":
        return bool(getattr(modules[str(n.target)], "inplace", False))
    if n.op == "call_function":
        return n.target in _IN_PLACE_FUNCTIONS or bool(n.kwargs.get("inplace", False)) or getattr(n.target, "__name__", "").endswith("_")
    if n.op == "call_method":
        return str(n.target).endswith("_") and not str(n.target).startswith("__")
    return False


def node_probe(traced: TracedStep, index: int) -> NodeProbe:
    """Graph node ``index`` of ``traced`` as a :class:`NodeProbe` on the values the traced step recorded."""
    graph = traced.graph
    node = graph.nodes[index]
    meta = graph.metadata
    fwd_name = meta["backward_of"][node.name] if node.is_backward else node.name
    values = traced.record.values
    gm = traced.gm
    is_loss = fwd_name == traced.loss_name
    modules = dict(gm.named_modules())
    leaves: list[torch.Tensor] = []
    # a node that writes its input in place (``ReLU(inplace=True)``, ``x += y``) gets copies of its inputs:
    # autograd refuses in-place writes to a leaf, and the recorded values must stay as they were
    copies = not is_loss and any(in_place(m, modules) for m in gm.graph.nodes if m.name in meta["fx_groups"][fwd_name])

    def fresh(value: object) -> object:
        """Detached copies of the recorded inputs, leaves requiring grad where the original did."""
        if isinstance(value, torch.Tensor):
            leaf = value.detach().requires_grad_(value.requires_grad)
            if leaf.requires_grad:
                leaves.append(leaf)
            return leaf.clone() if copies else leaf
        if isinstance(value, (tuple, list)):
            return type(value)(fresh(v) for v in value)
        return value

    if is_loss:
        def forward() -> object:
            leaves.clear()
            out = fx.node.map_arg(traced.output_args, lambda n: fresh(values[n.name]))
            return traced.loss_fn(out) if traced.targets is None else traced.loss_fn(out, traced.targets)

        params: list[torch.Tensor] = []
    else:
        member_names = meta["fx_groups"][fwd_name]
        fx_by_name = {n.name: n for n in gm.graph.nodes}
        members = [fx_by_name[m] for m in member_names]
        interpreter = fx.Interpreter(gm, garbage_collect_values=False)
        params = group_params(gm, members, modules)

        def forward() -> object:
            leaves.clear()
            env: dict[fx.Node, object] = {}
            for m in members:
                for dep in m.all_input_nodes:
                    if dep not in env and dep.name not in member_names:
                        env[dep] = fresh(values[dep.name]) if dep.op != "get_attr" else fetch_attr(gm, dep.target)
            interpreter.env = env
            out = None
            for m in members:
                out = env[m] = interpreter.run_node(m) if m.op != "placeholder" else values[m.name]
            # (a member's value that nothing saved is freed on return, as in a real step: a fused group's
            # inner tensors are its workspace, poetlab.torch.workspace, not memory it keeps)
            interpreter.env = {}
            env.clear()
            return out

    return NodeProbe(forward=forward, grad_targets=lambda: [*leaves, *params], is_backward=node.is_backward)



def node_flops(traced: TracedStep, index: int) -> tuple[int, int]:
    """(forward, backward) flops of forward node ``index`` run alone; (0, 0) for a backward node."""
    node = traced.graph.nodes[index]
    if node.is_backward or node.kind == "input":
        return 0, 0
    probe = node_probe(traced, index)
    with FlopCounterMode(display=False) as counter:
        out = probe.forward()
    forward = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        probe.run_backward(out)
    return forward, counter.get_total_flops()



def whole_step_flops(module: nn.Module, example_inputs, loss_fn, targets=None) -> tuple[int, int]:
    """(forward incl. loss, backward) flops of one plain training step, by FlopCounterMode: the
    reference that a traced graph's node flops must add up to."""
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    with restored_state(module):
        with FlopCounterMode(display=False) as counter:
            out = module(*inputs)
            loss = loss_fn(out) if targets is None else loss_fn(out, targets)
        forward = counter.get_total_flops()
        with FlopCounterMode(display=False) as counter:
            torch.autograd.grad(loss, [p for p in module.parameters() if p.requires_grad], allow_unused=True)
        return forward, counter.get_total_flops()

"""``poetlab.torch.trace`` against real torch: real fx graphs, real autograd saved tensors, real flop counts."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx, nn

import poetlab
from poetlab import TrainingGraph, trace
from poetlab.torch.models import ResNet18, build_torch_model
from poetlab.torch.probes import whole_step_flops
from poetlab.torch.trace import TraceError


class SkipNet(nn.Module):
    """y = relu(lin1(x)); z = lin2(y) + y: a skip connection between two layers."""

    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(6, 5)
        self.relu = nn.ReLU()
        self.lin2 = nn.Linear(5, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        y = self.relu(self.lin1(x))
        return self.head(self.lin2(y) + y)


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.gate = Gate()

    def forward(self, x):
        return self.gate(self.lin(x))


class Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace this
            return x * 2
        return x


def _cases():
    torch.manual_seed(0)
    resnet = ResNet18(num_classes=10, width=8).train()
    x = torch.randn(2, 3, 16, 16)
    yield "resnet8", resnet, x, nn.CrossEntropyLoss(), torch.randint(10, (2,))
    bert = build_torch_model("bert_small_torch", batch_size=2)
    yield "bert_small", bert.module, bert.inputs, bert.loss_fn, bert.targets
    mobile = build_torch_model("mobilenetv2_torch")
    yield "mobilenet64", mobile.module, torch.randn(1, 3, 64, 64), mobile.loss_fn, mobile.targets
    yield "skipnet", SkipNet(), torch.randn(4, 6), nn.CrossEntropyLoss(), torch.tensor([0, 1, 2, 0])


CASES = list(_cases())
IDS = [case[0] for case in CASES]
_TRACES: dict[tuple[str, bool], TrainingGraph] = {}


def _traced(case, fuse: bool) -> TrainingGraph:
    """One trace per case and fusion for the whole module (tracing runs every node for real)."""
    key = (case[0], fuse)
    if key not in _TRACES:
        _, module, inputs, loss_fn, targets = case
        _TRACES[key] = trace(module, inputs, loss_fn, targets, fuse=fuse)
    return _TRACES[key]


def _real_step(module, inputs, loss_fn, targets):
    """An independent real step through fx: each fx node's value, and the tensors autograd saved while
    each node ran (the loss under 'loss'), parameters left out."""
    gm = fx.symbolic_trace(module)
    values: dict[str, object] = {}
    saved: dict[str, list[torch.Tensor]] = {}
    current = ["loss"]

    class Run(fx.Interpreter):
        def run_node(self, n):
            current[0] = n.name
            values[n.name] = out = super().run_node(n)
            current[0] = "loss"
            return out

    def pack(t):
        saved.setdefault(current[0], []).append(t)
        return t

    state = {k: v.clone() for k, v in module.state_dict().items()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = Run(gm, garbage_collect_values=False).run(inputs)
        loss_fn(out, targets)
    module.load_state_dict(state)
    params = {p.untyped_storage().data_ptr() for p in [*module.parameters(), *module.buffers()]}
    params.add(targets.untyped_storage().data_ptr())
    return values, {k: [t for t in v if t.untyped_storage().data_ptr() not in params] for k, v in saved.items()}


def _producer(t: torch.Tensor, values: dict[str, object]) -> str | None:
    """The fx node whose output is ``t`` (same storage; the view with the same layout first)."""
    ptr = t.untyped_storage().data_ptr()
    same_storage = [name for name, v in values.items() if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() == ptr]
    for name in same_storage:
        v = values[name]
        if (v.storage_offset(), v.shape, v.stride()) == (t.storage_offset(), t.shape, t.stride()):
            return name
    return same_storage[0] if same_storage else None


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_reads_every_saved_tensor(case, fuse):
    _, module, inputs, loss_fn, targets = case
    graph = _traced(case, fuse)
    meta = graph.metadata
    index = {node.name: i for i, node in enumerate(graph.nodes)}
    group_of = {fx_name: g for g, names in meta["fx_groups"].items() for fx_name in names}
    grad_of = {fwd: bwd for bwd, fwd in meta["backward_of"].items()}
    values, saved = _real_step(module, inputs, loss_fn, targets)
    checked = 0
    for fx_name, tensors in saved.items():
        owner = meta["loss_node"] if fx_name == "loss" else group_of.get(fx_name)
        if owner is None or not tensors:
            continue
        backward = graph.nodes[index[grad_of[owner]]]
        for t in tensors:
            producer = _producer(t, values)
            # made inside the owner's node (or by one of its members): part of the owner's output
            needed = owner if producer is None or group_of.get(producer) == owner else group_of[producer]
            assert index[needed] in backward.inputs, f"{backward.name} does not read {needed}, whose tensor autograd saves"
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_flops_add_up_to_the_whole_step(case, fuse):
    _, module, inputs, loss_fn, targets = case
    graph = _traced(case, fuse)
    forward, backward = whole_step_flops(module, inputs, loss_fn, targets)
    assert forward > 0 and backward > 0
    assert sum(graph.nodes[i].flop for i in graph.forward_indices) == forward
    assert sum(graph.nodes[i].flop for i in graph.backward_indices) == backward


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_output_bytes_are_the_real_tensors(case, fuse):
    _, module, inputs, loss_fn, targets = case
    graph = _traced(case, fuse)
    meta = graph.metadata
    values, _ = _real_step(module, inputs, loss_fn, targets)
    for i in graph.forward_indices:
        node = graph.nodes[i]
        assert node.output_bytes == meta["tensor_bytes"][node.name] + meta["internal_saved_bytes"][node.name]
        if node.name == meta["loss_node"]:
            continue
        value = values[meta["fx_groups"][node.name][-1]]
        # (the batch is the caller's and a parameter's view owns no memory: no schedule frees either)
        # (nor a view of an earlier node's storage, counted at its base: metadata["view_of"])
        owned = node.kind != "input" and node.name not in meta["view_of"] and value.untyped_storage().data_ptr() not in {p.untyped_storage().data_ptr() for p in module.parameters()}
        assert meta["tensor_bytes"][node.name] == (value.numel() * value.element_size() if owned else 0)
        assert node.output_shape == tuple(value.shape)

    def size(j: int) -> int:
        value = values[meta["fx_groups"][graph.nodes[j].name][-1]]
        return value.numel() * value.element_size()

    for i in graph.backward_indices:  # gradients w.r.t. the forward node's inputs that require grad
        node = graph.nodes[i]
        fwd = graph.nodes[index_of(graph, meta["backward_of"][node.name])]
        # (a view's readers read its base too: not an input of the forward's computation)
        bases = {b for j in fwd.inputs for b in meta["view_of"].get(graph.nodes[j].name, ())}
        sizes = [size(j) for j in fwd.inputs if graph.nodes[j].kind != "input" and graph.nodes[j].name not in bases]
        # (each storage once: an add of two same-sized tensors hands its one gradient to both,
        # poetlab.torch.gradients)
        shared = fwd.kind == "add" and len(sizes) == 2 and sizes[0] == sizes[1]
        assert node.output_bytes == (sizes[0] if shared else sum(sizes)), node.name


def index_of(graph: TrainingGraph, name: str) -> int:
    return next(i for i, node in enumerate(graph.nodes) if node.name == name)


def test_skip_connection_appears_in_the_backward():
    graph = trace(SkipNet(), torch.randn(4, 6), nn.CrossEntropyLoss(), torch.tensor([0, 1, 2, 0]))
    names = [node.name for node in graph.nodes]
    grad_relu = graph.nodes[names.index("grad:relu")]
    # relu's output feeds lin2 and the add: its gradient is the sum of both backward nodes' outputs
    assert names.index("grad:lin2") in grad_relu.inputs and names.index("grad:add") in grad_relu.inputs
    assert names.index("relu") in grad_relu.inputs  # ReLU's backward reads its own output
    assert names.index("lin1") not in grad_relu.inputs
    grad_add = graph.nodes[names.index("grad:add")]
    assert grad_add.inputs == (names.index("grad:head"),)  # an add saves nothing
    assert "grad:x" not in names  # the data needs no gradient
    assert graph.metadata["fx_groups"]["relu"] == ["relu"]


def test_fusion_keeps_a_valid_training_graph():
    torch.manual_seed(0)
    module = ResNet18(width=8)
    x, y = torch.randn(1, 3, 16, 16), torch.tensor([3])
    plain = trace(module, x, nn.CrossEntropyLoss(), y)
    fused = trace(module, x, nn.CrossEntropyLoss(), y, fuse=True)
    assert fused.n_nodes < plain.n_nodes / 2
    gm = fx.symbolic_trace(module)
    fx_names = [n.name for n in gm.graph.nodes if n.op in ("placeholder", "call_module", "call_function", "call_method")]
    groups = fused.metadata["fx_groups"]
    members = [name for g in groups.values() for name in g]
    assert sorted(members) == sorted(fx_names)  # every fx node in exactly one node
    tails = {g[-1] for g in groups.values() if g}
    by_name = {n.name: n for n in gm.graph.nodes}
    for g in groups.values():
        for name in g[:-1]:  # inner members are read only inside their group
            assert all(user.name in g for user in by_name[name].users)
    assert all(n.name in tails for n in gm.graph.nodes if n.op == "output" for n in n.all_input_nodes)
    assert "Conv2d+BatchNorm2d+add+ReLU" in {node.kind for node in fused.nodes}
    assert TrainingGraph.from_json(fused.to_json()) == fused
    assert fused.param_bytes == plain.param_bytes == sum(p.numel() * 4 for p in module.parameters())


def test_tracing_leaves_the_module_unchanged():
    torch.manual_seed(0)
    module = ResNet18(width=8)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    x = torch.randn(2, 3, 16, 16)
    rng = torch.get_rng_state()
    trace(module, x, nn.CrossEntropyLoss(), torch.tensor([1, 2]), fuse=True)
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())


def test_untraceable_module_names_the_operation_and_the_way_out():
    with pytest.raises(TraceError) as info:
        trace(DataDependent(), torch.randn(2, 4), lambda out: out.sum())
    message = str(info.value)
    assert "\n" not in message
    assert "if x.sum() > 0" in message and "test_trace.py" in message
    assert "module 'gate' (Gate)" in message and "leaf_modules=('gate',)" in message
    graph = trace(DataDependent(), torch.randn(2, 4), lambda out: out.sum(), leaf_modules=("gate",))
    assert [node.kind for node in graph.nodes if not node.is_backward] == ["input", "Linear", "Gate", "loss"]


def test_gradients_of_a_traced_graph_are_pinned(tmp_path):
    """A traced graph's gradients live in autograd's engine (and its loss in the step): the simulator
    refuses a schedule that pages or recomputes one, and no planner proposes one (POET's MILP at a
    budget tight enough to page and recompute, the greedy starts, DTR, Capuchin)."""
    import poetlab
    from poetlab.planners.baselines import capuchin, dtr
    from poetlab.planners.baselines.base import Budgets, CannotMeetBudget
    from poetlab.planners.heuristics import greedy_paging_schedule, greedy_remat_schedule
    from poetlab.core.schedule import InvalidScheduleError, Op, OpKind, Schedule, checkpoint_all_schedule, simulate

    torch.manual_seed(0)
    module = ResNet18(10, width=4).train()
    graph = trace(module, torch.randn(2, 3, 16, 16), nn.CrossEntropyLoss(), torch.tensor([1, 2]), fuse=True)
    pinned = graph.pinned
    # (and the loss, which the step holds to the end of its backward: a rerun would make a second one)
    assert pinned.tolist() == [node.is_backward or node.kind == "loss" for node in graph.nodes]
    assert TrainingGraph.load(graph.save(tmp_path / "g.json")).pinned.tolist() == pinned.tolist()
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    ops = list(checkpoint_all_schedule(graph).ops)
    gradient = next(i for i in graph.backward_indices if graph.consumers[i])
    at = next(k for k, op in enumerate(ops) if op.kind is OpKind.COMPUTE and op.node == gradient)
    paged = ops[: at + 1] + [Op(OpKind.PAGE_OUT, gradient, ops[at].stage)] + ops[at + 1 :]
    with pytest.raises(InvalidScheduleError, match="autograd's engine"):
        simulate(Schedule(graph.n_nodes, tuple(paged)), graph, costs)
    full = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    schedules = []
    for fraction in (0.6, 0.7):  # (of checkpoint-all, its backward workspaces the lower ones left alone)
        budget = fraction * full
        schedules += [greedy_paging_schedule(graph, costs, budget), greedy_remat_schedule(graph, costs, budget)]
        for planner in (dtr.plan, capuchin.plan):
            try:
                schedules.append(planner(graph, costs, Budgets(budget, None)))
            except CannotMeetBudget:
                pass
        schedules.append(poetlab.solve(graph, costs, budget, time_limit_s=2).schedule)
    schedules = [s for s in schedules if s is not None]
    assert len(schedules) >= 4
    assert any(op.kind is OpKind.PAGE_OUT for s in schedules for op in s.ops)
    assert any(op.kind is OpKind.COMPUTE and graph.nodes[op.node].kind != "input" and op.stage != op.node for s in schedules for op in s.ops)
    for schedule in schedules:
        simulate(schedule, graph, costs)
        assert not any(op.kind is OpKind.PAGE_OUT and pinned[op.node] for op in schedule.ops)
        computes = [op.node for op in schedule.ops if op.kind is OpKind.COMPUTE]
        assert all(computes.count(i) == 1 for i in map(int, pinned.nonzero()[0]))


def test_fused_inplace_activation_is_counted_once():
    """A ReLU(inplace=True) fused after its convolution writes the group's output into the storage the
    convolution allocated: that storage is the group's output (counted once), not an internal tensor."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(inplace=True), nn.Flatten())
    x = torch.randn(1, 3, 8, 8)
    graph = trace(module, x, lambda out: out.square().mean(), fuse=True)
    for node in graph.nodes:
        if not node.is_backward and node.kind.startswith("Conv2d"):
            assert node.kind.startswith("Conv2d+ReLU")
            assert node.output_bytes == 4 * 8 * 8 * 4 and graph.metadata["internal_saved_bytes"][node.name] == 0


class TwoGates(nn.Module):
    """Two modules fx cannot trace, of two classes: one error names both."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.first = Gate()
        self.second = Clamp()

    def forward(self, x):
        return self.second(self.first(self.lin(x)))


class Clamp(nn.Module):
    def forward(self, x):
        while x.max() > 1:  # data-dependent
            x = x / 2
        return x


class ShapesAndConstants(nn.Module):
    """Shape values (``x.size(0)``), a tensor made in forward (an fx tensor constant), a plain tensor
    attribute, and an in-place ReLU on a node's output."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)
        self.scale = torch.linspace(0.5, 1.5, 8)  # (not a buffer: fx makes it a tensor constant)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        n = x.size(0)
        h = self.relu(self.lin(x)) * self.scale
        h = h + torch.arange(8, dtype=x.dtype)  # (made from scratch in forward)
        return self.out(h.view(n, -1))


def test_one_error_names_every_untraceable_module_and_their_classes():
    with pytest.raises(TraceError) as info:
        trace(TwoGates(), torch.randn(2, 4), lambda out: out.sum())
    message = str(info.value)
    assert "\n" not in message and "2 place(s)" in message
    assert "module 'first' (Gate)" in message and "module 'second' (Clamp)" in message
    assert "leaf_modules=('first', 'second',)" in message and "leaf_modules=(Gate, Clamp,)" in message


def test_leaf_modules_are_recorded_and_the_executor_honours_them():
    module = TwoGates()
    x = torch.randn(2, 4)
    graph = trace(module, x, lambda out, _: out.sum(), 0, leaf_modules=(Gate, Clamp))
    assert graph.metadata["leaf_modules"] == ["first", "second"]
    from poetlab.core.schedule import checkpoint_all_schedule
    from poetlab.torch.execute import execute

    reference = copy.deepcopy(module)
    reference(x).sum().backward()
    execute(module, checkpoint_all_schedule(graph), (x, 0), graph=graph, loss_fn=lambda out, _: out.sum())
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(reference.parameters(), module.parameters(), strict=True))


@pytest.mark.parametrize("fuse", [False, True])
def test_shapes_and_constants_are_no_storage_and_the_module_is_left_as_it_was(fuse):
    """No node for ``x.size(0)``; fx's tensor constants are constants of the step (never a node's bytes,
    nothing freed), taken back off the module; an in-place ReLU traces unfused (one node with its producer);
    a schedule that frees and recomputes every forward tensor it can runs with autograd's gradients."""
    from poetlab.planners.heuristics import minimal_recompute
    from poetlab.core.schedule import Schedule, checkpoint_all_schedule, simulate
    from poetlab.torch.execute import ScheduleExecutor

    torch.manual_seed(0)
    module = ShapesAndConstants().train()
    attributes = set(vars(module))
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])
    graph = trace(module, x, nn.CrossEntropyLoss(), y, fuse=fuse)
    assert set(vars(module)) == attributes
    assert "size" not in graph.metadata["fx_code"]
    assert not any(node.kind in ("size", "getattr") for node in graph.nodes)
    assert any("+ReLU" in node.kind for node in graph.nodes)  # (the in-place ReLU with the Linear it writes)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    # (this small step has no room below checkpoint-all for a planner, so the schedule is made by hand: every
    # forward tensor freed once the loss is computed and recomputed where a backward node reads it)
    T = graph.n_nodes
    S_RAM = checkpoint_all_schedule(graph).matrices().S_RAM[:T].copy()
    loss = next(i for i, node in enumerate(graph.nodes) if node.kind == "loss")
    S_RAM[loss + 1:, [i for i in graph.forward_indices if graph.nodes[i].kind not in ("input", "loss")]] = False
    schedule = Schedule.from_matrices(graph, minimal_recompute(graph, S_RAM), S_RAM)
    assert simulate(schedule, graph, costs).n_recomputes > 0
    reference, scheduled = copy.deepcopy(module), copy.deepcopy(module)
    executor = ScheduleExecutor(scheduled, graph, schedule, nn.CrossEntropyLoss())
    for _ in range(2):
        nn.CrossEntropyLoss()(reference(x), y).backward()
        executor.step(x, y)
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(reference.parameters(), scheduled.parameters(), strict=True))
    assert set(vars(scheduled)) == set(vars(reference))


def test_a_backward_that_reads_only_what_autograd_saved_inside_a_node_lets_its_output_go():
    """Dropout saves its mask, LayerNorm its statistics (and its input, the node before's): neither backward reads
    its own output, which a plain step frees after its last reader, so ``metadata["saved_internal_only"]`` names
    them and ``TrainingGraph.early_release`` lets their output go from the stage after that reader's, the mask
    and statistics kept; a ReLU's backward reads its output (kept). Checkpoint-all's simulated peak is then a
    plain step's measured one."""
    from poetlab.core.schedule import checkpoint_all_schedule, simulate
    from poetlab.torch.allocations import measure_allocations
    from poetlab.torch.kernels import planned_kernels

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Dropout(0.5), nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 4)).train()
    x, y = torch.randn(32, 16), torch.randint(4, (32,))
    with planned_kernels():
        graph = trace(model, x, nn.CrossEntropyLoss(), y)
        index = {node.name: i for i, node in enumerate(graph.nodes)}
        only = graph.metadata["saved_internal_only"]
        assert only == {"grad:_1": ["_1"], "grad:_3": ["_3"], "grad:loss": ["loss"]}  # (the loss: its log-softmax)
        tensor = graph.metadata["tensor_bytes"]
        # dropout: read by _2 and _2's backward (a Linear saves its input); LayerNorm: by the ReLU only
        assert graph.early_release == {
            index["_1"]: (index["grad:_2"] + 1, tensor["_1"], (index["_2"], index["grad:_2"])),
            index["_3"]: (index["_4"] + 1, tensor["_3"], (index["_4"],)),
        }
        costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
        predicted = simulate(checkpoint_all_schedule(graph), graph, costs, fixed_bytes=graph.metadata["loss_storage_bytes"]).peak_ram_bytes
        kept = TrainingGraph(graph.name, graph.nodes, {**graph.metadata, "saved_internal_only": {}})
        assert simulate(checkpoint_all_schedule(kept), kept, costs).peak_ram_bytes > predicted
        module = copy.deepcopy(model)
        with measure_allocations() as allocation:
            nn.CrossEntropyLoss()(module(x), y).backward()
    measured = allocation.peak_excluding(p.grad.data_ptr() for p in module.parameters())
    assert abs(predicted / measured - 1) <= 0.01, (predicted, measured)

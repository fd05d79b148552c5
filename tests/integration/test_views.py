"""Views in a traced graph: a node whose output lies in another node's storage (nanoGPT's ``q, k, v =
self.c_attn(x).split(C, dim=2)``, a transpose, a flatten) owns none of its bytes. The trace records its base
(``metadata["view_of"]``), counts the storage once, at the base, and makes whatever reads the view read the
base too, so that every planner, and the one simulator, keeps the base in RAM while a view is read; the
executor never frees or pages a view's memory apart from its base. Checked through trace, schedules that
page, free or recompute a view or its base (on a split attention and on the zoo's nanoGPT), POET at a tight
budget, and execution beside plain autograd, each step's measured peak within the budget the schedule
fits (its simulated peak and the bytes ``solve`` keeps free)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import poetlab
from execute_cases import check_step, trains_as_plain_autograd
from poetlab.core.schedule import Op, OpKind, Schedule, checkpoint_all_schedule, simulate
from poetlab.planners.comparison import budget_ladder
from poetlab.torch.execute import ScheduleExecutor
from poetlab.torch.trace import trace
from poetlab.torch.user_models import load_user_model
from repo_paths import REPO

pytestmark = pytest.mark.usefixtures("deterministic_torch")

C, T, H = 16, 8, 2


class SplitAttention(nn.Module):
    """One attention head as nanoGPT writes it: q, k and v are views of one projection's output."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(C, C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.head = nn.Linear(T * C, 4)

    def forward(self, x):
        B, _, _ = x.size()
        h = torch.tanh(self.embed(x))
        q, k, v = self.c_attn(h).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H)), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.head(torch.tanh(self.proj(y)).flatten(1))


def _case(fuse: bool):
    torch.manual_seed(0)
    module = SplitAttention()
    inputs, targets = torch.randn(6, T, C), torch.randint(4, (6,))
    graph = trace(module, inputs, nn.CrossEntropyLoss(), targets, fuse=fuse)
    return module, inputs, targets, graph, poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))


def _index(graph, name: str) -> int:
    return next(i for i, node in enumerate(graph.nodes) if node.name == name)


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
def test_a_view_owns_no_bytes_and_whatever_reads_it_reads_its_base(fuse):
    _, _, _, graph, _ = _case(fuse)
    view_of = graph.metadata["view_of"]
    base = _index(graph, "c_attn")
    split = [v for v, bases in view_of.items() if bases == ["c_attn"]]
    assert "split" in split and len(split) >= 4  # the split and q, k, v (with their transposes, unfused)
    assert graph.nodes[base].output_bytes == 6 * T * 3 * C * 4  # the projection's storage, counted once
    for name in split:
        v = _index(graph, name)
        assert graph.nodes[v].output_bytes == 0
        for j in graph.consumers[v]:
            assert base in graph.nodes[j].inputs, (name, graph.nodes[j].name)


def _paging_views(graph, views: set[int]) -> Schedule:
    """Checkpoint-all, with ``views`` paged out after they are computed and in before their first reader: a
    view owns nothing, so these move no byte, and must not empty its base's storage (which its siblings read)."""
    readers = {v: min(graph.consumers[v]) for v in views}
    ops = []
    for op in checkpoint_all_schedule(graph).ops:
        if op.kind is OpKind.COMPUTE:
            ops += [Op(OpKind.PAGE_IN, v, op.stage) for v in sorted(views) if readers[v] == op.node]
        ops.append(op)
        if op.kind is OpKind.COMPUTE and op.node in views and op.node == op.stage:
            ops += [Op(OpKind.PAGE_OUT, op.node, op.stage), Op(OpKind.FREE, op.node, op.stage)]
    return Schedule(graph.n_nodes, tuple(ops))


def _recomputing_the_base(graph, base_name: str = "c_attn") -> Schedule:
    """Checkpoint-all, with the projection freed once its first reader has run (its views stay) and
    recomputed before the next node that reads one of them."""
    base = _index(graph, base_name)
    first, *later = sorted(j for j in range(graph.n_nodes) if base in graph.nodes[j].inputs and j > min(graph.consumers[base]) and not graph.nodes[j].is_backward)
    ops = []
    for op in checkpoint_all_schedule(graph).ops:
        if op.kind is OpKind.COMPUTE and op.node == later[0] and op.stage == op.node:
            ops.append(Op(OpKind.COMPUTE, base, op.stage))
        ops.append(op)
        if op.kind is OpKind.COMPUTE and op.node == first and op.stage == op.node:
            ops.append(Op(OpKind.FREE, base, op.stage))
    return Schedule(graph.n_nodes, tuple(ops))


def _views(graph, base_name: str = "c_attn") -> list[int]:
    return sorted(_index(graph, v) for v, bases in graph.metadata["view_of"].items() if bases == [base_name])


def _schedules(graph, which: str, base_name: str = "c_attn") -> list[Schedule]:
    if which == "each view alone":
        return [_paging_views(graph, {v}) for v in _views(graph, base_name)]
    if which == "all views":
        return [_paging_views(graph, set(_views(graph, base_name)))]
    return [_recomputing_the_base(graph, base_name)]


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("which", ["each view alone", "all views", "the base recomputed"])
def test_a_view_is_never_freed_or_paged_apart_from_its_base(fuse, which):
    module, inputs, targets, graph, costs = _case(fuse)
    for schedule in _schedules(graph, which):
        budget = simulate(schedule, graph, costs).peak_ram_bytes + graph.reserved_bytes  # (valid, and what it fits)
        result = check_step("split", fuse, schedule, graph, costs, module, inputs, targets)
        assert result.n_pageouts + result.n_recomputes > 0
        assert result.peak_bytes <= budget, (result.peak_bytes, budget)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["each view alone", "all views", "the base recomputed"])
def test_nanogpts_q_k_and_v_are_paged_and_recomputed_with_their_projection(which):
    """The zoo's nanoGPT, fused (q, k and v are ``getitem`` nodes of the first block's split): paging v
    alone emptied the projection that q and k read ("setStorage ... out of bounds for storage of size 0")."""
    model = load_user_model(f"{REPO}/examples/nanogpt.py:make")
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets, fuse=True)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    assert len(_views(graph, "h_0_attn_c_attn")) == 4  # (the split and its three items)
    for schedule in _schedules(graph, which, "h_0_attn_c_attn"):
        budget = simulate(schedule, graph, costs).peak_ram_bytes + graph.reserved_bytes
        result = trains_as_plain_autograd(model, graph, schedule, budget, label=which)
        assert result.n_pageouts + result.n_recomputes > 0


@pytest.mark.parametrize("fuse", [pytest.param(False, marks=pytest.mark.slow), True], ids=["plain", "fused"])  # (plain: 20 s, slow)
def test_poet_at_a_tight_budget_trains_as_plain_autograd_within_it(fuse):
    module, inputs, targets, graph, costs = _case(fuse)
    for budget in budget_ladder(graph, costs, (0.1, 0.3, 0.5, 0.7, 0.9)):
        result = poetlab.solve(graph, costs, budget, time_limit_s=10)
        if result.schedule is not None and (result.schedule.n_recomputes or result.schedule.count(OpKind.PAGE_OUT)):
            break
    else:
        pytest.fail("no budget makes POET recompute or page")
    executed = check_step("split", fuse, result.schedule, graph, costs, module, inputs, targets)
    assert executed.peak_bytes <= budget, (executed.peak_bytes, budget)


@pytest.mark.parametrize("fuse", [False, True], ids=["plain", "fused"])
def test_views_held_past_their_bases_free_hold_no_memory(fuse):
    """A view owns no bytes, so a schedule may keep one past its base's free at no cost by the simulator's
    count (POET's do, for nanoGPT's q, k and v); its value must then not keep the base's storage alive. Here
    checkpoint-all with the views of the projection freed only at the end: as in a plain step, the
    projection's storage is gone by the time ``proj`` runs (nothing saves it), in the first step and in the
    learnt ones. (It stayed to the end of the forward pass: nanoGPT measured 24.6 KB over its budget.)"""
    import weakref

    module, inputs, targets, graph, costs = _case(fuse)
    views = set(_views(graph))
    ops = [op for op in checkpoint_all_schedule(graph).ops if not (op.kind is OpKind.FREE and op.node in views)]
    held = Schedule(graph.n_nodes, (*ops, *[Op(OpKind.FREE, v, graph.n_nodes - 1) for v in sorted(views)]))
    simulate(held, graph, costs)  # (valid)
    alive = []
    for fast in (True, False):
        scheduled = copy.deepcopy(module)
        projection = []
        scheduled.c_attn.register_forward_hook(lambda _m, _i, out: projection.append(weakref.ref(out.untyped_storage())))
        scheduled.proj.register_forward_pre_hook(lambda _m, _i: alive.append(projection[-1]() is not None))
        executor = ScheduleExecutor(scheduled, graph, held, nn.CrossEntropyLoss(), fast=fast)
        for _ in range(3):
            executor.step(inputs, targets)
    assert alive == [False] * 6

"""The schedule format and the simulator, on hand-written schedules."""

from __future__ import annotations

import numpy as np
import pytest

from poetlab import CostModel, load_platform
from poetlab.core.schedule import InvalidScheduleError, Op, OpKind, Schedule, checkpoint_all_schedule, simulate

from small_graphs import mlp, residual

C, F, OUT, IN = OpKind.COMPUTE, OpKind.FREE, OpKind.PAGE_OUT, OpKind.PAGE_IN


@pytest.fixture
def chain():
    graph = mlp()
    return graph, CostModel.from_flops(graph, load_platform("m0"))


def _schedule(graph, ops):
    return Schedule(graph.n_nodes, tuple(Op(kind, node, stage) for kind, node, stage in ops))


def test_checkpoint_all_costs_one_plain_step(chain):
    graph, costs = chain
    schedule = checkpoint_all_schedule(graph)
    sim = simulate(schedule, graph, costs)
    assert sim.energy_j == pytest.approx(costs.plain_step_energy_j, rel=1e-12)
    assert sim.n_recomputes == 0 and sim.n_pageouts == 0 and sim.n_pageins == 0
    assert sim.compute_time_s == pytest.approx(costs.plain_step_runtime_s, rel=1e-12)
    # peak by hand. Nodes: 0 input 32 B, 1 linear 64, 2 relu 64, 3 linear 16, 4 relu 16, 5 loss 16, then
    # gradients g6 (16 B, shape of the loss), g7 (16), g8 (16), g9 (64), g10 (64). When g9 (reading 1, 2
    # and g8) runs, everything after layer 2 has been freed: 32 + 64 + 64 + 16 + 64 = 240 bytes, more
    # than the 224 bytes alive when g6 runs on top of the whole forward pass.
    expected = 240
    assert sim.peak_ram_bytes == expected
    assert sim.memory_trace_bytes.max() == expected


def test_matrix_view_round_trips(chain):
    graph, _ = chain
    schedule = checkpoint_all_schedule(graph)
    m = schedule.matrices()
    assert np.array_equal(m.R, np.eye(graph.n_nodes, dtype=bool))
    assert not m.S_RAM[0].any() and not m.S_SSD.any()
    rebuilt = Schedule.from_matrices(graph, m.R, m.S_RAM, m.S_SSD, m.M_IN, m.M_OUT)
    assert rebuilt == schedule


def test_recompute_and_paging_by_hand(chain):
    graph, costs = chain  # nodes: 0 input, 1 linear, 2 relu, 3 linear, 4 relu, 5 loss, 6.. gradients
    ops = [
        (C, 0, 0), (C, 1, 1), (OUT, 0, 2), (F, 0, 2), (C, 2, 2), (F, 1, 2),  # page the input out, drop linear1
        (C, 3, 3), (C, 4, 4), (C, 5, 5), (C, 6, 6), (F, 5, 6), (C, 7, 7), (F, 4, 7), (F, 6, 7),
        (C, 8, 8), (F, 3, 8), (F, 7, 8), (IN, 0, 8), (C, 1, 9), (C, 9, 9), (F, 8, 9), (F, 2, 9),
        (C, 10, 10), (F, 1, 10), (F, 9, 10),
    ]
    sim = simulate(_schedule(graph, ops), graph, costs)
    assert sim.n_recomputes == 1 and sim.n_pageouts == 1 and sim.n_pageins == 1
    expected = costs.plain_step_energy_j + costs.compute_energy_j[1] + costs.pagein_energy_j[0] + costs.pageout_energy_j[0]
    assert sim.energy_j == pytest.approx(expected, rel=1e-12)
    assert sim.paging_time_s == pytest.approx(costs.pagein_time_s[0] + costs.pageout_time_s[0], rel=1e-12)
    assert sim.runtime_s == pytest.approx(sim.compute_time_s + sim.paging_time_s, rel=1e-12)


@pytest.mark.parametrize(
    "ops,step,reason",
    [
        ([(C, 1, 0)], 0, "is not in RAM"),  # computed before its input
        ([(C, 0, 0), (IN, 0, 0)], 1, "never paged out"),
        ([(C, 0, 0), (F, 0, 0), (F, 0, 0)], 2, "not in RAM"),
        ([(OUT, 0, 0)], 0, "not in RAM"),
        ([(C, 0, 0), (C, 1, 1)], 2, "never computed"),
        ([(C, 0, 1), (C, 1, 0)], 1, "comes after stage"),
        ([(C, 99, 0)], 0, "does not exist"),
    ],
)
def test_invalid_schedules_name_step_and_reason(chain, ops, step, reason):
    graph, costs = chain
    with pytest.raises(InvalidScheduleError) as info:
        simulate(_schedule(graph, ops), graph, costs)
    assert info.value.step == step
    assert reason in str(info.value)


def test_budgets_are_enforced(chain):
    graph, costs = chain
    schedule = checkpoint_all_schedule(graph)
    peak = simulate(schedule, graph, costs).peak_ram_bytes
    simulate(schedule, graph, costs, ram_budget_bytes=peak)
    with pytest.raises(InvalidScheduleError, match="exceeds the budget"):
        simulate(schedule, graph, costs, ram_budget_bytes=peak - 1)
    with pytest.raises(InvalidScheduleError, match="exceeds the budget"):
        simulate(schedule, graph, costs, ram_budget_bytes=peak, fixed_bytes=1)
    with pytest.raises(InvalidScheduleError, match="runtime"):
        simulate(schedule, graph, costs, runtime_budget_s=0.99 * costs.plain_step_runtime_s)


def test_branching_graph_frees_after_last_use():
    graph = residual()
    costs = CostModel.from_flops(graph, load_platform("a72"))
    schedule = checkpoint_all_schedule(graph)
    sim = simulate(schedule, graph, costs)
    frees = [op for op in schedule.ops if op.kind is F]
    # every tensor is freed once, right after the last node that reads it (the last node: at the end)
    assert sorted(op.node for op in frees) == list(range(graph.n_nodes))
    for op in frees:
        users = graph.consumers[op.node]
        assert op.stage == (max(users) if users else op.node)
    assert sim.memory_trace_bytes[-1] == 0


def test_page_ins_the_next_stage_does_not_keep_are_dropped(chain):
    """A time-limited MILP answer may page a tensor in that stage t + 1 does not keep (waste the MILP
    does not count in t + 1's memory): the decoder drops it instead of carrying it out."""
    graph, costs = chain
    schedule = _schedule(graph, [(C, 0, 0), (C, 1, 1), (OUT, 0, 2), (F, 0, 2)] + [(C, t, t) for t in range(2, graph.n_nodes)])
    m = schedule.matrices()
    assert m.S_SSD[3, 0] and not m.S_RAM[4, 0]
    wasteful = m.M_IN.copy()
    wasteful[3, 0] = True  # page the input in at the end of stage 3 and keep it nowhere
    rebuilt = Schedule.from_matrices(graph, m.R, m.S_RAM, m.S_SSD, wasteful, m.M_OUT)
    assert rebuilt.count(IN) == 0
    kept = wasteful.copy()
    S_RAM = m.S_RAM.copy()
    S_RAM[4, 0] = True  # now stage 4 keeps it: the page-in is carried out
    assert Schedule.from_matrices(graph, m.R, S_RAM, m.S_SSD, kept, m.M_OUT).count(IN) == 1


def test_a_schedule_round_trips_through_its_file(tmp_path):
    """Schedule.save/load: the same operations back, and a time-limited plan can be kept and run again;
    a file that is not a schedule, or one with a node out of range, is one line that names the file."""
    from poetlab import ScheduleFileError
    from poetlab.planners.heuristics import greedy_paging_schedule

    graph = residual()
    costs = CostModel.from_flops(graph, load_platform("a72"))
    full = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    schedule = greedy_paging_schedule(graph, costs, 0.7 * full)
    assert schedule.count(OpKind.PAGE_OUT)  # (every kind of row, not only computes and frees)
    path = schedule.save(tmp_path / "plans" / "residual.json")
    loaded = Schedule.load(path)
    assert loaded == schedule
    assert simulate(loaded, graph, costs).energy_j == simulate(schedule, graph, costs).energy_j
    bad = {
        "not json": "{",
        "not a schedule": '{"format": "poetlab.TrainingGraph", "version": 1}',
        "a newer version": '{"format": "poetlab.Schedule", "version": 2, "n_nodes": 1, "ops": []}',
        "an unknown kind": '{"format": "poetlab.Schedule", "version": 1, "n_nodes": 1, "ops": [["swap", 0, 0]]}',
        "a node out of range": '{"format": "poetlab.Schedule", "version": 1, "n_nodes": 1, "ops": [["compute", 1, 0]]}',
        "a row too short": '{"format": "poetlab.Schedule", "version": 1, "n_nodes": 1, "ops": [["compute", 0]]}',
        "a stage that is not a number": '{"format": "poetlab.Schedule", "version": 1, "n_nodes": 1, "ops": [["compute", 0, true]]}',
    }
    for what, text in bad.items():
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ScheduleFileError) as caught:
            Schedule.load(tmp_path / "bad.json")
        assert str(tmp_path / "bad.json") in str(caught.value) and "\n" not in str(caught.value), what
    with pytest.raises(ScheduleFileError, match="cannot read"):
        Schedule.load(tmp_path / "missing.json")


def _dropout_chain(release: bool = True):
    """x -> a (linear) -> d (dropout: 100 B output, 50 B mask) -> h (linear, saves d) -> loss, then gradients; the
    dropout's backward reads its mask only (``metadata["saved_internal_only"]``, as ``poetlab.torch.trace`` records it)."""
    from poetlab.core.graph import Node, TrainingGraph

    nodes = [
        Node("x", "input", (), (1,), 0, 0.0), Node("a", "Linear", (0,), (1,), 100, 1.0), Node("d", "Dropout", (1,), (1,), 150, 1.0),
        Node("h", "Linear", (2,), (1,), 100, 1.0), Node("loss", "loss", (3,), (), 4, 1.0),
        Node("grad:loss", "backward", (4,), (), 4, 1.0, is_backward=True), Node("grad:h", "backward", (5, 2), (1,), 100, 1.0, is_backward=True),
        Node("grad:d", "backward", (6, 2), (1,), 100, 1.0, is_backward=True), Node("grad:a", "backward", (7, 0), (1,), 0, 1.0, is_backward=True),
    ]
    metadata = {"tensor_bytes": {"d": 100}, "saved_internal_only": {"grad:d": ["d"]}} if release else {}
    return TrainingGraph("dropout_chain", tuple(nodes), metadata)


def test_a_left_alone_nodes_output_goes_after_its_last_tensor_reader_and_its_mask_stays():
    """The dropout's output is read by h and h's backward (a Linear saves its input); its own backward reads the
    mask only: left alone, the 100 output bytes go after grad:h, the 50 of the mask stay to grad:d. Paged, or
    with its reader h recomputed, the executor keeps the output to its free: counted in full."""
    from poetlab.core.schedule import released_nodes

    graph, plain = _dropout_chain(), _dropout_chain(release=False)
    assert graph.early_release == {2: (7, 100, (3, 6))} and plain.early_release == {}
    costs = CostModel.from_flops(graph, load_platform("m0"))
    everything = checkpoint_all_schedule(graph)
    assert released_nodes(graph, everything) == {2}
    sim, full = simulate(everything, graph, costs), simulate(everything, plain, costs)
    grad_d = np.array([op.kind is C and op.node == 7 for op in everything.ops])  # (then d is freed)
    assert np.array_equal(full.memory_trace_bytes - sim.memory_trace_bytes, np.where(grad_d, 100, 0))
    rerun_h = [
        (C, 0, 0), (C, 1, 1), (C, 2, 2), (F, 1, 2), (C, 3, 3), (C, 4, 4), (F, 3, 4), (C, 5, 5), (F, 4, 5),
        (C, 3, 6), (C, 6, 6), (F, 3, 6), (F, 5, 6), (C, 7, 7), (F, 2, 7), (F, 6, 7), (C, 8, 8), (F, 7, 8),
    ]
    paged = [
        (C, 0, 0), (C, 1, 1), (C, 2, 2), (F, 1, 2), (C, 3, 3), (OUT, 2, 3), (F, 2, 3), (C, 4, 4), (F, 3, 4), (C, 5, 5), (F, 4, 5),
        (IN, 2, 5), (C, 6, 6), (F, 5, 6), (C, 7, 7), (F, 2, 7), (F, 6, 7), (C, 8, 8), (F, 7, 8),
    ]
    for ops in (rerun_h, paged):
        schedule = _schedule(graph, ops)
        assert not released_nodes(graph, schedule)
        assert np.array_equal(simulate(schedule, graph, costs).memory_trace_bytes, simulate(schedule, plain, costs).memory_trace_bytes)

"""The benchmarks' reference step (``benchmarks/bench_execute.py``'s ``HandStep``): the executor's own time is
what its steps take beyond this one, so its reruns must be the schedule's reruns, the random numbers that
dropout drew in the forward pass included."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import poetlab
from poetlab.execute import ScheduleExecutor
from poetlab.heuristics import greedy_remat_schedule
from poetlab.schedule import checkpoint_all_schedule, simulate
from poetlab.torch_models import build_torch_model
from poetlab.trace import trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_execute import HandStep, planned_schedule  # noqa: E402  (a script's class, not the package's)


def test_the_hand_steps_reruns_replay_the_random_numbers_of_their_first_runs():
    """With the nodes that draw (the executor's ``draws_rng``) a rerun gives its first run's output bit for
    bit; without them it draws new numbers and does not (so the check can fail)."""
    model = build_torch_model("bert_small_torch", 2, seed=0)
    module = model.module.train()
    graph = trace(module, model.inputs, model.loss_fn, model.targets, fuse=False)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule = greedy_remat_schedule(graph, costs, 0.95 * simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes)
    executor = ScheduleExecutor(module, graph, schedule, model.loss_fn)
    executor.step(model.inputs, model.targets)
    drawing = {i for i, draws in executor.draws_rng.items() if draws}
    hand = HandStep(module, graph, schedule, model.loss_fn, rng_nodes=drawing)
    replayed = [i for i in hand.rng_nodes if executor.binding.members[i][-1].op == "call_module"]
    assert replayed, "the schedule reruns no node that draws random numbers"
    layer = module.get_submodule(str(executor.binding.members[replayed[0]][-1].target))
    for rng_nodes, same in ((drawing, True), (set(), False)):
        outputs: list[torch.Tensor] = []  # (its forward pass's, then its rerun's)
        handle = layer.register_forward_hook(lambda _m, _i, out: outputs.append(out.detach().clone()))
        try:
            HandStep(module, graph, schedule, model.loss_fn, rng_nodes=rng_nodes).step(model.inputs, model.targets)
        finally:
            handle.remove()
        assert len(outputs) == 2 and torch.equal(outputs[0], outputs[1]) == same, rng_nodes


def test_the_benchmarks_keep_a_cases_plan_and_run_it_again(tmp_path):
    """``--schedules``: the first run plans a case with the MILP and keeps the plan; the next runs load that
    very schedule (a time-limited solve may return another); a kept plan that no longer fits the budget
    stops the run with the file named; checkpoint-all is never kept."""
    import pytest

    from small_graphs import residual

    graph = residual()
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    full = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    solved, status, _ = planned_schedule(graph, costs, 0.7 * full, "residual-0.7", "poet", 10.0, tmp_path)
    assert solved is not None and status != "loaded" and (tmp_path / "residual-0.7.json").exists()
    loaded, status, message = planned_schedule(graph, costs, 0.7 * full, "residual-0.7", "poet", 10.0, tmp_path)
    assert status == "loaded" and loaded == solved and "residual-0.7.json" in message
    with pytest.raises(SystemExit, match="residual-0.7.json"):
        planned_schedule(graph, costs, 0.1 * full, "residual-0.7", "poet", 10.0, tmp_path)
    assert planned_schedule(graph, costs, full, "residual-1", "poet", 10.0, tmp_path)[1] == "checkpoint_all"
    assert not (tmp_path / "residual-1.json").exists()

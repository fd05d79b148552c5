"""Chain plans (docs/solve.md, NOTE 21): the backward pass's rebuilds of a forward chain re-planned over a seed schedule,
on real graphs, every plan replayed by the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from poetlab.core.schedule import InvalidScheduleError
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.planners.poet.backends import relative_gap
from poetlab.core.graph import cut_vertices
from poetlab.planners.poet.bounds import eviction_bound
from poetlab.planners.poet.chain import chain_plan
from poetlab.planners.poet.solver import solve

from solve_checks import grid_instance



def test_greedy_remats_bert_schedule_replanned_is_within_the_gap_of_the_eviction_bound():
    """bert/m4 at 50% (Fig. 3 and the grid): greedy remat's schedule rebuilds BERT's layers several times over (7%
    above the eviction bound); with its chain re-planned it replays within both budgets at 2x and 1.05x and within
    0.1% of the eviction bound, where `solve`'s searches stopped 0.13% above it in 60 s (NOTE 16-20). The plan keeps
    every hold of the tensors the seed does not rebuild in the backward pass."""
    for factor in (2.0, 1.05):
        graph, costs, options, replay, budgets = grid_instance("bert", "m4", 0.5, factor)
        seed = greedy_remat_schedule(graph, costs, budgets.ram_bytes)
        bound = eviction_bound(graph, costs, options)
        planned = chain_plan(graph, costs, budgets.ram_bytes, seed, budgets.fixed_bytes)
        assert planned is not None
        sim = replay(planned)
        assert relative_gap(sim.energy_j, bound) <= 1e-3
        if factor == 2.0:  # (the seed itself: far above the bound; at 1.05x over the runtime budget)
            assert relative_gap(replay(seed).energy_j, bound) > 0.05
        else:
            with pytest.raises(InvalidScheduleError):
                replay(seed)
        before, after = seed.matrices().as_dict(), planned.matrices().as_dict()
        P = min(graph.backward_indices)
        kept = ~np.asarray(before["R"], dtype=bool)[P:].any(axis=0)  # (never rebuilt in the backward pass)
        assert (np.asarray(before["S_RAM"])[:, kept] == np.asarray(after["S_RAM"])[:, kept]).all()


@pytest.mark.parametrize("model,fraction", [("resnet18_cifar", 0.2), ("resnet18_cifar", 0.5), ("bert", 0.1)])
def test_a_plan_is_a_schedule_of_the_graph_or_none(model, fraction):
    """On other graphs and budgets the plan may not pay or fit, but it is a consistent schedule (the simulator replays
    it without budgets, every node computed at its stage) or None."""
    graph, costs, options, replay, budgets = grid_instance(model, "m4", fraction, 1.5)
    seed = greedy_remat_schedule(graph, costs, budgets.ram_bytes)
    assert seed is not None
    planned = chain_plan(graph, costs, budgets.ram_bytes, seed, budgets.fixed_bytes)
    if planned is None:
        return
    R = np.asarray(planned.matrices().as_dict()["R"], dtype=bool)
    assert R[np.arange(graph.n_nodes), np.arange(graph.n_nodes)].all()
    try:
        replay(planned)
    except InvalidScheduleError:
        pass


@pytest.mark.slow
@pytest.mark.parametrize("factor", [2.0, 1.05])
def test_solve_certifies_bert_m4_at_half_the_budget(factor):
    """Fig. 3's bert/m4/0.5/2x and the grid's 1.05x: `solve` at a 60 s limit ends `optimal` (within 0.1% of the
    eviction bound) by the chain plans after the first repair, in seconds; before them it stopped at its limit
    0.13-0.34% above the bound."""
    graph, costs, options, replay, budgets = grid_instance("bert", "m4", 0.5, factor)
    result = solve(graph, costs, budgets.ram_bytes, factor, time_limit_s=60, mip_gap=1e-3, threads=1)
    assert result.status == "optimal" and result.mip_gap <= 1e-3
    assert result.solve_time_s < 30
    assert replay(result.schedule).energy_j == pytest.approx(result.energy_j, rel=1e-12)


@pytest.mark.parametrize("example", ["mha", "gru", "tied"])
def test_solve_runs_the_chain_plans_on_traced_models_whose_cut_vertices_no_backward_node_reads(example):
    """A traced attention block, GRU or tied-weight model has cut vertices that no backward node reads (an add's or a
    view's output, whose gradient needs none of it): the plan has no rerun stage for their segments and is skipped,
    and `solve` answers (before the fix it raised `min() arg is an empty sequence` from the chain plans)."""
    import poetlab
    from poetlab.core.schedule import simulate
    from poetlab.planners.comparison import budget_ladder
    from poetlab.torch.trace import trace
    from poetlab.torch.user_models import load_user_model
    from repo_paths import REPO

    model = load_user_model(f"{REPO / 'examples' / example}.py:make")
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets, fuse=False)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("m4"))
    P = min(graph.backward_indices)
    assert any(not any(c >= P for c in graph.consumers[v]) for v in cut_vertices(graph) if v < P)  # (the case itself)
    budget = budget_ladder(graph, costs, (0.1,))[0]
    result = solve(graph, costs, budget, 1.2, time_limit_s=3, mip_gap=1e-3, threads=1)
    assert result.schedule is not None and result.status in ("optimal", "time_limit")
    assert simulate(result.schedule, graph, costs, ram_budget_bytes=budget, fixed_bytes=graph.reserved_bytes).energy_j == pytest.approx(result.energy_j, rel=1e-12)

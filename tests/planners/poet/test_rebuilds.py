"""The rebuild bound (NOTE 23) against exact optima of POET's MILP: never above one, above the eviction bound where a
rebuild in the backward pass needs inputs the eviction bound does not charge."""

from __future__ import annotations

import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.planners.comparison import budget_ladder
from poetlab.planners.poet.backends import run_milp
from poetlab.planners.poet.bounds import cover_problem, eviction_bound
from poetlab.planners.poet.milp import MilpOptions, build_milp
from poetlab.planners.poet.rebuilds import REBUILD_STEP, TIGHT_STAGES, default_stages, rebuild_bound, tight_stages
from poetlab.planners.poet.solver import solve

from small_graphs import convnet, residual, tiny_bert
from solve_checks import grid_instance

LEVERS = {"poet": {}, "remat-only": {"paging": False}, "paging-only": {"remat": False}, "fixes": {"count_paging_time": True, "charge_pagein": True}}


def _instance(graph, platform, fraction, **levers):
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    options = MilpOptions(ram_budget_bytes=int(footprint + fraction * (peak - footprint)), runtime_budget_factor=1.5, **levers)
    return costs, options


def _every_backward_stage(graph, costs, options):
    """Every stage over budget from the first backward node on: the most rows the bound takes."""
    problem = cover_problem(graph, costs, options)
    return [t for t, _, _ in problem.demands if t >= min(graph.backward_indices)] if problem else []


def _bounds_and_optimum(graph, platform, fraction, levers):
    costs, options = _instance(graph, platform, fraction, **LEVERS[levers])
    plain = costs.plain_step_energy_j
    exact = run_milp(build_milp(graph, costs, options), solver="highs", mip_gap=1e-7, threads=1)
    evicted = eviction_bound(graph, costs, options) / plain
    rebuilt = [rebuild_bound(graph, costs, options, stages=stages).bound_j / plain for stages in (default_stages, _every_backward_stage(graph, costs, options), tight_stages)]
    return exact, evicted, rebuilt, plain


@pytest.mark.parametrize("graph", [residual, convnet], ids=["residual", "convnet"])
@pytest.mark.parametrize("platform", ["m4", "m0"])
@pytest.mark.parametrize("fraction", [0.1, 0.5])
@pytest.mark.parametrize("levers", list(LEVERS))
def test_the_bound_never_exceeds_the_exact_optimum(graph, platform, fraction, levers):
    exact, evicted, rebuilt, plain = _bounds_and_optimum(graph(), platform, fraction, levers)
    assert min(rebuilt) >= 1.0
    if exact.status == "optimal":
        assert max(rebuilt) <= exact.objective / plain * (1 + 1e-7)
    else:
        assert exact.status == "infeasible"


@pytest.mark.parametrize("graph,platform,fraction", [(residual, "m4", 0.1), (convnet, "m4", 0.1), (convnet, "m0", 0.1)], ids=["residual-m4", "convnet-m4", "convnet-m0"])
def test_the_bound_moves_above_the_eviction_bound_where_a_rebuild_needs_its_inputs(graph, platform, fraction):
    """A skip or a chain rebuilt in the backward pass needs the tensors below it: the eviction bound charges only the
    rerun of what it evicts, and the rebuild rows close (part of) the gap to the exact optimum."""
    exact, evicted, rebuilt, plain = _bounds_and_optimum(graph(), platform, fraction, "poet")
    assert exact.status == "optimal"
    assert evicted * (1 + 1e-3) < max(rebuilt) <= exact.objective / plain * (1 + 1e-7)


@pytest.mark.parametrize("graph,platform,fraction", [(residual, "m0", 0.0), (residual, "a72", 0.05), (convnet, "m4", 0.0)], ids=["residual-m0", "residual-a72", "convnet-m4"])
def test_at_consecutive_stages_the_bound_meets_the_exact_optimum(graph, platform, fraction):
    """NOTE 35: at consecutive chosen stages a tensor in RAM at stage t and read at t + 1 is held across t or rerun at
    t + 1 (POET's matrices cannot free it at t and page it in again for t + 1). At every backward stage over budget
    (all consecutive) the bound then meets the exact optimum on these instances, where without those rows it stopped
    1-6% below it (residual/m0 at the footprint 1.081142 against 1.092605; convnet/m4 1.963247 against 2.078380)."""
    exact, evicted, rebuilt, plain = _bounds_and_optimum(graph(), platform, fraction, "poet")
    assert exact.status == "optimal"
    optimum = exact.objective / plain
    assert optimum * (1 - 1e-5) <= rebuilt[1] <= optimum * (1 + 1e-7)
    assert evicted < optimum * (1 - 1e-3)


def test_at_resnet50_m4s_smallest_footprint_a_convolution_paged_in_twice_across_a_stage_of_no_room_is_charged():
    """Fig. 3's resnet50/m4/0/2x (NOTE 35): the tight stages' point paged layer 1's convolutions in for their
    batch-norms' reruns at a stage of no room and again, at that stage, for the stage after, which POET's matrices
    cannot do (the schedules paged the batch-norm instead, 0.0013 plain steps more each). The rows at consecutive stages
    charge it: the bound rises from 1.092435 to 1.096449 plain steps, and stays below the schedule `solve` certifies."""
    graph, costs, options, _, _ = grid_instance("resnet50", "m4", 0.0, 2.0)
    tight = rebuild_bound(graph, costs, options, time_limit_s=20.0, stages=tight_stages)
    assert tight.optimal
    plain = costs.plain_step_energy_j
    assert 1.0960 < tight.bound_j / plain < 1.103260  # (the schedule the 60 s solve certifies, NOTE 35)
    T = graph.n_nodes
    block = [int(a) for a in tight.block]
    for k, (t, following) in enumerate(zip(tight.stages, tight.stages[1:])):
        if k == 0 or following != t + 1 or tight.stages[k - 1] != t - 1:
            continue
        for q, a in enumerate(block):  # (in RAM at t, read by a rerun at t + 1: held across t or rerun itself)
            read_next = any(c in block and tight.rerun[k, block.index(c)] for c in graph.consumers[a] if c < T)
            present = tight.held[k - 1, q] or tight.rerun[k - 1, q] or tight.paged[k - 1, q]
            free = a == t or a in graph.nodes[t].inputs or graph.pinned[a]
            assert free or not (present and read_next) or tight.held[k, q] or tight.rerun[k, q]


@pytest.mark.slow
@pytest.mark.parametrize("fraction,levers", [(0.1, "poet"), (0.2, "poet"), (0.2, "remat-only"), (0.2, "fixes")])
def test_on_blocks_of_bert_the_bound_stays_below_the_exact_optimum_and_moves(fraction, levers):
    """Two BERT blocks at toy sizes (skip-adds, attention, FFN; 35 nodes): exact optima in 5-60 s."""
    exact, evicted, rebuilt, plain = _bounds_and_optimum(tiny_bert(2), "m4", fraction, levers)
    assert exact.status == "optimal"
    assert max(rebuilt) <= exact.objective / plain * (1 + 1e-7)
    assert max(rebuilt) > evicted * (1 + 1e-3)


def test_the_stages_start_at_the_backward_passs_tightest_and_step_by_a_layer():
    graph = build_paper_graph("bert_seq8")
    costs = CostModel.from_flops(graph, load_platform("m4"))
    options = MilpOptions(ram_budget_bytes=budget_ladder(graph, costs, [0.5])[0], runtime_budget_factor=2.0)
    problem = cover_problem(graph, costs, options)
    stages = default_stages(graph, problem.demands)
    over = {t: graph.output_bytes_least[live].sum() - room for t, live, room in problem.demands if t >= min(graph.backward_indices)}
    assert stages[0] == max(over, key=over.get)
    assert all(b - a == REBUILD_STEP for a, b in zip(stages, stages[1:]))  # (bert_seq8's backward stages over budget are consecutive)


def test_bert_seq8_at_its_smallest_footprint_gets_a_bound_above_the_eviction_bound_and_below_a_schedule():
    """Fig. 3's bert_seq8/m4/0/2x: each layer's skip-adds rebuilt in the backward pass need the layer below; the bound
    is above the eviction bound and below what `solve` finds."""
    graph = build_paper_graph("bert_seq8")
    costs = CostModel.from_flops(graph, load_platform("m4"))
    budget = budget_ladder(graph, costs, [0.0])[0]
    options = MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=2.0)
    evicted = eviction_bound(graph, costs, options)
    rebuilt = rebuild_bound(graph, costs, options, time_limit_s=10.0)
    assert rebuilt.bound_j > evicted * (1 + 1e-2)
    result = solve(graph, costs, budget, 2.0, mip_gap=1e-3, threads=1, time_limit_s=5.0)
    assert result.energy_j is not None and rebuilt.bound_j <= result.energy_j
    assert result.bound_j > evicted * (1 + 1e-2)  # (solve's own, for 0.5 s: optimal in about 0.2 s here)


def test_the_bounds_point_made_a_schedule_and_chain_planned_certifies_bert_seq8_at_half_the_budget():
    """Fig. 3's bert_seq8/m4/0.5/2x: the point holds the layers' linears across the first backward stage and rebuilds
    the skip-adds from the input; as a schedule with its chain re-planned it is within 0.1% of the bound (NOTE 23),
    where every other start stops 0.2% above it."""
    graph = build_paper_graph("bert_seq8")
    costs = CostModel.from_flops(graph, load_platform("m4"))
    budget = budget_ladder(graph, costs, [0.5])[0]
    options = MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=2.0)
    rebuilt = rebuild_bound(graph, costs, options, time_limit_s=10.0)
    assert rebuilt.recompute is not None and rebuilt.recompute.sum() > 0
    result = solve(graph, costs, budget, 2.0, mip_gap=1e-3, threads=1, time_limit_s=30.0)
    assert result.status == "optimal" and result.solver == "bound"
    assert rebuilt.bound_j <= result.energy_j <= rebuilt.bound_j * (1 + 1e-3)


def test_at_resnet50s_smallest_footprint_the_tight_stages_leave_no_room_and_raise_the_bound_below_a_schedule():
    """Fig. 3's resnet50/jetsontx2/0/2x (NOTE 28): six stages of layer 1's backward pass leave no room beside the node,
    so every tensor read after them is rebuilt or paged in after them, with its inputs. At them and their neighbours
    the bound rises above the eviction bound (1.003302 against 1.002785 plain steps), where the default stages (from
    the stage most bytes over) prove no more than it; and it stays below what `solve` finds."""
    graph = build_paper_graph("resnet50")
    costs = CostModel.from_flops(graph, load_platform("jetsontx2"))
    budget = budget_ladder(graph, costs, [0.0])[0]
    options = MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=2.0)
    problem = cover_problem(graph, costs, options)
    rooms = {t: room for t, _, room in problem.demands if t >= min(graph.backward_indices)}
    stages = tight_stages(graph, problem.demands)
    least = sorted(rooms.values())[:TIGHT_STAGES]
    assert least[-1] == 0 and {t for t in stages if rooms[t] == 0} == {t for t in rooms if rooms[t] == 0}
    assert all(t in rooms and (rooms[t] == 0 or rooms.get(t - 1) == 0 or rooms.get(t + 1) == 0) for t in stages)
    evicted = eviction_bound(graph, costs, options)
    default = rebuild_bound(graph, costs, options, time_limit_s=10.0)
    tight = rebuild_bound(graph, costs, options, time_limit_s=10.0, stages=tight_stages)
    assert tight.stages == tuple(stages)
    assert default.bound_j <= evicted * (1 + 1e-4) < tight.bound_j * (1 - 4e-4)
    result = solve(graph, costs, budget, 2.0, mip_gap=1e-3, threads=1, time_limit_s=20.0)
    assert result.energy_j is not None and tight.bound_j <= result.energy_j
    # (solve's own bound: the tight stages' in its rebuild phase, 1 s at this limit. Solved, it is 1.003302; stopped by a
    # loaded machine it was 1.003296 (load 6). Nothing else in this solve passes the eviction bound: its default stages
    # prove no more, and the interval relaxation's bound stays below it, NOTE 28.)
    assert result.bound_j > evicted * (1 + 2e-4)


def test_without_paging_no_rows_at_consecutive_stages_and_fig4s_remat_only_row_certifies_at_once():
    """NOTE 35's rows at consecutive stages charge a tensor freed and paged in again: without the paging lever no
    schedule does that, so the rows are left out (with them the second round's point on Fig. 4's remat-only
    resnet18_cifar/m4/0.2, at the window point 1.0204x, made a schedule 4 KB over RAM, and the solve found none in
    60 s; without them its schedule certifies in under 2 s)."""
    graph = build_paper_graph("resnet18_cifar")
    costs = CostModel.from_flops(graph, load_platform("m4"))
    budget = budget_ladder(graph, costs, [0.2])[0]
    result = solve(graph, costs, budget, 1.0204, paging=False, mip_gap=1e-3, threads=1, time_limit_s=60.0)
    assert result.status == "optimal" and result.energy_j is not None
    assert result.schedule is not None and simulate(result.schedule, graph, costs).peak_ram_bytes <= budget

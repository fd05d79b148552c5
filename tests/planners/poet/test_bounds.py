"""The eviction bound against exact optima: never above one, above the trivial bound where the budget
binds, and an end to the solve when a schedule meets it."""

from __future__ import annotations

from pathlib import Path

import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.planners.poet.bounds import HIGHS_ABS_GAP, eviction_bound
from poetlab.planners.poet.milp import MilpOptions, build_milp
from poetlab.core.graph import min_footprint_bytes
from poetlab.planners.comparison import budget_ladder
from poetlab.planners.poet.solver import solve
from poetlab.core.schedule import Schedule, checkpoint_all_schedule, simulate
from poetlab.planners.poet.backends import run_milp

from small_graphs import convnet, residual

#: schedules found offline that `solve` does not reach within its limit, kept as witnesses of what docs/solve.md says
#: of a row's optimum (never a start of the pipeline's solves: its numbers come out of its own search)
WITNESSES = Path(__file__).parent / "witnesses"


def _setup(model, platform):
    graph = build_paper_graph(model) if isinstance(model, str) else model
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    return graph, costs, peak, footprint


@pytest.mark.parametrize("model,platform", [("linear", "m4"), ("residual", "m0"), ("convnet", "m4")])
@pytest.mark.parametrize("fraction", [0.1, 0.5])
@pytest.mark.parametrize(
    "levers", [{}, {"paging": False}, {"remat": False}, {"count_paging_time": True, "charge_pagein": True}], ids=["poet", "remat-only", "paging-only", "fixes"]
)
def test_bound_never_exceeds_the_exact_optimum(model, platform, fraction, levers):
    graph = {"residual": residual, "convnet": convnet}.get(model, lambda: model)()
    graph, costs, peak, footprint = _setup(graph, platform)
    budget = int(footprint + fraction * (peak - footprint))
    options = MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=1.5, **levers)
    exact = run_milp(build_milp(graph, costs, options), solver="highs", mip_gap=1e-7, threads=1)
    bound = eviction_bound(graph, costs, options)
    assert bound >= costs.plain_step_energy_j
    if exact.status == "optimal":
        assert bound <= exact.objective * (1 + 1e-7)
    else:
        assert exact.status == "infeasible"


def test_bound_moves_and_meets_the_optimum_on_a_chain():
    """linear on m4, 10% of the way from the footprint to checkpoint-all, 1.05x: the bound is the optimum
    (1.0108951 plain steps, less HiGHS's absolute gap, which a bound gives back), where the LP relaxation of the MILP
    proves only one plain step."""
    graph, costs, peak, footprint = _setup("linear", "m4")
    budget = int(footprint + 0.1 * (peak - footprint))
    bound = eviction_bound(graph, costs, MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=1.05))
    assert bound / costs.plain_step_energy_j == pytest.approx(1.0108950594 - HIGHS_ABS_GAP, rel=1e-9)
    result = solve(graph, costs, budget, 1.05, mip_gap=1e-6, threads=1)
    assert result.status == "optimal" and result.energy_j == pytest.approx(bound, rel=1e-6)
    assert bound <= result.bound_j <= result.energy_j * (1 + 1e-9)


def test_the_old_trivial_bound_is_still_there_for_comparison():
    graph, costs, peak, footprint = _setup("linear", "m4")
    budget = int(footprint + 0.1 * (peak - footprint))
    old = solve(graph, costs, budget, 1.05, mip_gap=1e-3, threads=1, bound="trivial", staged=False)
    new = solve(graph, costs, budget, 1.05, mip_gap=1e-3, threads=1, staged=False)
    assert old.status == new.status == "optimal"
    assert old.solver == "highs" and new.solver == "bound"  # a start meets the eviction bound: no MILP
    assert new.energy_j == pytest.approx(old.energy_j, rel=1e-3)
    with pytest.raises(Exception, match="valid bounds: eviction, trivial"):
        solve(graph, costs, budget, 1.05, bound="lagrange")


def test_a_budget_that_holds_everything_proves_nothing():
    graph, costs, peak, _ = _setup("resnet18_cifar", "a72")
    assert eviction_bound(graph, costs, MilpOptions(ram_budget_bytes=peak, runtime_budget_factor=1.2)) == costs.plain_step_energy_j
    assert eviction_bound(graph, costs, MilpOptions(ram_budget_bytes=peak // 2, compression=True)) == costs.plain_step_energy_j


def test_cover_schedules_replay_and_start_poet_below_the_greedy_starts():
    """resnet18_cifar on m4, 10% of the way, 1.05x: the linked cover's schedule replays within both
    budgets at exactly its covering objective, above the bound, and below every greedy start."""
    from poetlab.planners.poet.bounds import cover_schedules
    from poetlab.planners.heuristics import greedy_paging_schedule

    graph, costs, peak, footprint = _setup("resnet18_cifar", "m4")
    budget = int(footprint + 0.1 * (peak - footprint))
    options = MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=1.05)
    runtime_s = 1.05 * costs.plain_step_runtime_s
    energies = []
    for schedule in cover_schedules(graph, costs, options):
        try:
            energies.append(simulate(schedule, graph, costs, ram_budget_bytes=budget, runtime_budget_s=runtime_s).energy_j)
        except Exception:  # the unlinked cover's recomputation chains may break the runtime budget
            continue
    assert energies and min(energies) >= eviction_bound(graph, costs, options)
    greedy = simulate(greedy_paging_schedule(graph, costs, budget), graph, costs, ram_budget_bytes=budget).energy_j
    assert min(energies) < greedy


def test_the_bounds_count_an_output_let_go_before_its_saved_tensors_at_its_least():
    """A traced attention's or dropout's output goes after its last tensor reader where the schedule leaves the
    node alone (``TrainingGraph.early_release``): the simulator and the MILP count the node less those bytes from
    there. The bounds relax every schedule's memory, so they count ``graph.output_bytes_least``: with the full
    bytes the interval relaxation proved 1.0247 plain steps at a budget where checkpoint-all (one plain step)
    fits, a bound above a schedule. Here each bound stays at or under a schedule that fits its budget."""
    import torch  # noqa: F401  (a traced model of examples/)

    from poetlab.planners.heuristics import greedy_remat_schedule
    from poetlab.planners.poet.intervals import interval_bound
    from poetlab.planners.poet.relaxation import stage_relaxation
    from poetlab.torch.trace import trace
    from poetlab.torch.user_models import load_user_model
    from repo_paths import REPO

    model = load_user_model(f"{REPO}/examples/mha.py:make")
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets, fuse=True)
    assert graph.early_release and (graph.output_bytes_least < graph.output_bytes).any()
    costs = CostModel.from_flops(graph, load_platform("m4"))
    everything = checkpoint_all_schedule(graph)
    peak = simulate(everything, graph, costs).peak_ram_bytes
    schedules = [everything, greedy_remat_schedule(graph, costs, 0.8 * peak)]
    assert schedules[1] is not None
    for schedule in schedules:
        sim = simulate(schedule, graph, costs)
        options = MilpOptions(ram_budget_bytes=sim.peak_ram_bytes + graph.reserved_bytes)
        bounds = {
            "eviction": eviction_bound(graph, costs, options, time_limit_s=10),
            "interval": interval_bound(graph, costs, options, time_limit_s=10, gap_rows=True).bound_j,
            "stage": stage_relaxation(graph, costs, options, time_limit_s=10).bound_j,
        }
        for name, bound in bounds.items():
            assert bound <= sim.energy_j * (1 + 1e-9), (name, bound / costs.plain_step_energy_j, sim.energy_j / costs.plain_step_energy_j)


def test_a_bound_read_from_highs_holds_where_it_stopped_on_its_absolute_gap():
    """A covering problem whose objective is tiny (as the eviction bound's is, in plain steps): HiGHS stops
    "optimal" within its absolute gap and reports the incumbent as its dual bound, above the optimum (found
    with the objective scaled up). ``proven_extra`` gives back what the stopping rule allows."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    from poetlab.planners.poet.bounds import proven_extra

    rng = np.random.default_rng(0)
    fooled = 0
    for _ in range(4):
        weights = rng.integers(10, 100, 60).astype(float)
        values = weights + rng.integers(0, 10, 60) + rng.random(60)
        cover = [LinearConstraint(weights[None, :], 0.37 * weights.sum(), np.inf)]
        solve_scaled = lambda scale: milp(values * scale, constraints=cover, integrality=np.ones(60), bounds=Bounds(0, 1), options={"mip_rel_gap": 1e-6})
        optimum = solve_scaled(1.0).fun * 1e-8
        tiny = solve_scaled(1e-8)
        assert tiny.status == 0
        fooled += tiny.mip_dual_bound > optimum * (1 + 1e-9)
        assert proven_extra(tiny, 1e-6) <= optimum
    assert fooled >= 1  # (HiGHS's reported bound was above the optimum at least once: the case this guards)


@pytest.mark.parametrize("factor", [2.0, 1.05])
def test_bert_on_the_m4_at_half_the_budget_is_within_a_tenth_of_a_percent_of_the_eviction_bound(factor):
    """NOTE 19: Fig. 3's bert/m4/0.5 (2x) and the grid's (1.05x) share a budget and an eviction bound (1.013709 plain
    steps); windows cut along the skip-add chain found a schedule 0.093% above it in 14 minutes offline, kept as a
    witness: replayed within both budgets it lies between the bound and the bound's 0.1%, so the eviction bound,
    loose by construction on this chain (NOTE 16), is loose by less than the certifying gap here."""
    graph = build_paper_graph("bert", 1)
    costs = CostModel.from_flops(graph, load_platform("m4"))
    ram = budget_ladder(graph, costs, [0.5])[0]
    schedule = Schedule.load(WITNESSES / "bert-m4-0.5.schedule.json", graph)
    replayed = simulate(schedule, graph, costs, ram_budget_bytes=ram, runtime_budget_s=factor * costs.plain_step_runtime_s, fixed_bytes=graph.reserved_bytes)
    bound = eviction_bound(graph, costs, MilpOptions(ram, factor))
    assert bound > 1.01 * costs.plain_step_energy_j  # the budget binds: the bound is not the trivial one
    assert bound <= replayed.energy_j <= bound / (1 - 1e-3)

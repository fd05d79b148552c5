"""The interval relaxation (docs/solve.md, NOTE 5) against exact optima of POET's MILP (real HiGHS): its
bound never above one, never below the eviction bound where both are solved to optimality; its
schedules replay at their objective, and on resnet18_cifar/m4 at 10% below every other start."""

from __future__ import annotations

import pytest

from poetlab import build_paper_graph
from poetlab.core.schedule import InvalidScheduleError, Schedule, simulate
from poetlab.planners.poet.backends import run_milp
from poetlab.planners.poet.bounds import HIGHS_ABS_GAP, eviction_bound
from poetlab.planners.poet.idle_gaps import with_gap_rows
from poetlab.planners.poet.intervals import _build, _meets_rows, interval_bound, interval_point, interval_schedule, interval_start, interval_value
from poetlab.planners.poet.milp import MilpOptions, build_milp

from bound_cases import GRAPHS, LEVERS, OTHERS, QUICK, setup
from small_graphs import convnet, relu_chain, residual

SLOW = [pytest.param(*case, marks=pytest.mark.slow) for case in OTHERS]


@pytest.mark.parametrize("model,platform,fraction,levers", QUICK + SLOW)
def test_interval_bound_never_exceeds_the_exact_optimum(model, platform, fraction, levers):
    levers = LEVERS[levers]
    graph = GRAPHS[model]()
    costs, peak, footprint = setup(graph, platform)
    extra = 2 * graph.param_bytes if levers.get("params_in_budget") else 0
    budget = int(footprint + fraction * (peak - footprint)) + extra
    options = MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=1.2, **levers)
    exact = run_milp(build_milp(graph, costs, options), solver="highs", mip_gap=1e-7, threads=1, time_limit_s=120)
    found = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9)
    assert found.bound_j >= costs.plain_step_energy_j
    if exact.status == "optimal":
        assert found.bound_j <= exact.objective * (1 + 1e-7)
        if found.optimal:  # both covering problems solved exactly: the input bound keeps every row of the eviction bound
            assert found.bound_j >= eviction_bound(graph, costs, options) * (1 - 1e-7)
    else:
        assert exact.status == "infeasible"


def test_interval_bound_moves_above_the_eviction_bound_on_a_chain():
    """A chain of ten ReLUs on m4 at 5% of the way from the footprint to checkpoint-all: recomputing an
    activation needs the one before it, which the eviction bound does not charge."""
    graph = relu_chain(10)
    costs, peak, footprint = setup(graph, "m4")
    options = MilpOptions(ram_budget_bytes=int(footprint + 0.05 * (peak - footprint)), runtime_budget_factor=1.2)
    found = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9)
    exact = run_milp(build_milp(graph, costs, options), solver="highs", mip_gap=1e-7, threads=1)
    assert found.optimal and exact.status == "optimal"
    assert eviction_bound(graph, costs, options) < found.bound_j <= exact.objective * (1 + 1e-7)


def test_kept_through_rows_reach_the_exact_optimum_on_a_conv_chain_at_the_smallest_footprint():
    """Five convolutions on m4 at the smallest footprint, 2x (NOTE 8): without the kept-through rows the
    relaxation pages a tensor in at three stages in a row, counted in none of their memory rows, and proves
    2.130774 plain steps; with them it proves the exact optimum, 2.356554 (less HiGHS's
    absolute gap, which a bound gives back)."""
    graph = convnet(depth=5)
    costs, _, footprint = setup(graph, "m4")
    options = MilpOptions(ram_budget_bytes=footprint, runtime_budget_factor=2.0)
    exact = run_milp(build_milp(graph, costs, options), solver="highs", mip_gap=1e-7, threads=1, time_limit_s=120)
    without = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, kept_rows=False)
    found = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9)
    assert exact.status == "optimal" and without.optimal and found.optimal
    assert without.bound_j < 0.95 * exact.objective
    assert found.bound_j == pytest.approx(exact.objective, rel=1e-6)


def test_interval_start_certifies_a_conv_chain_at_the_smallest_footprint():
    """The same instance through ``interval_start`` (no margin leaves room for the footprint, so its schedules
    come from solves at the budget): the bound is the optimum, and a schedule replays at it."""
    graph = convnet(depth=5)
    costs, _, footprint = setup(graph, "m4")
    runtime = 2.0 * costs.plain_step_runtime_s
    bound_j, schedules, _ = interval_start(graph, costs, MilpOptions(ram_budget_bytes=footprint, runtime_budget_factor=2.0), time_limit_s=30)
    energies = []
    for schedule in schedules:
        try:
            energies.append(simulate(schedule, graph, costs, ram_budget_bytes=footprint, runtime_budget_s=runtime).energy_j)
        except InvalidScheduleError:
            continue
    assert bound_j / costs.plain_step_energy_j == pytest.approx(2.356554 - HIGHS_ABS_GAP, abs=1e-6)
    assert energies and min(energies) == pytest.approx(bound_j, rel=1e-6)


def test_interval_starts_least_solution_bounds_the_relaxation_without_its_rows_from_above():
    """``interval_start``'s third value, the least solution HiGHS found at the budget, is at or above the optimum of the
    relaxation without the kept-through and idle-gap rows (``solve`` skips that relaxation after the far path where the
    value is below the bound: NOTE 15). On this chain at its footprint that optimum is far below the bound (the test
    above), and so is the value: the skip fires."""
    graph = convnet(depth=5)
    costs, _, footprint = setup(graph, "m4")
    options = MilpOptions(ram_budget_bytes=footprint, runtime_budget_factor=2.0)
    bound_j, _, least_j = interval_start(graph, costs, options, time_limit_s=30)
    without = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, kept_rows=False)
    assert without.optimal and least_j is not None
    assert without.bound_j <= least_j * (1 + 1e-9) and least_j < bound_j


SMALLEST = [("convnet", "m4", "fixes"), ("relu_chain", "m4", "poet"), ("residual", "m0", "params"), ("linear", "m4", "remat-only"), ("residual", "m0", "paging-only")]


@pytest.mark.slow
@pytest.mark.parametrize("model,platform,levers", SMALLEST)
def test_interval_bound_never_exceeds_the_exact_optimum_at_the_smallest_footprint(model, platform, levers):
    """At the smallest footprint nearly every stage is over budget, so the kept-through rows bind at most
    stages: the bound stays at or below the exact optimum (2x and 1.2x)."""
    levers = LEVERS[levers]
    graph = GRAPHS[model]()
    costs, _, footprint = setup(graph, platform)
    extra = 2 * graph.param_bytes if levers.get("params_in_budget") else 0
    for factor in (2.0, 1.2):
        options = MilpOptions(ram_budget_bytes=footprint + extra, runtime_budget_factor=factor, **levers)
        exact = run_milp(build_milp(graph, costs, options), solver="highs", mip_gap=1e-7, threads=1, time_limit_s=120)
        found = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9)
        if exact.status == "optimal":
            assert found.bound_j <= exact.objective * (1 + 1e-7)
        else:
            assert exact.status == "infeasible"


def test_a_budget_that_holds_everything_proves_nothing():
    graph = residual()
    costs, peak, _ = setup(graph, "m0")
    found = interval_bound(graph, costs, MilpOptions(ram_budget_bytes=peak, runtime_budget_factor=1.2))
    assert found.bound_j == costs.plain_step_energy_j and found.schedule is None
    assert interval_bound(graph, costs, MilpOptions(ram_budget_bytes=peak // 2, compression=True)).bound_j == costs.plain_step_energy_j


@pytest.mark.slow
def test_interval_schedule_replays_below_the_other_starts_on_resnet18_cifar():
    """resnet18_cifar on m4, 10% of the way, 1.05x: the relaxation's schedule replays within both budgets,
    above the bound, below 1.2 plain steps, where the other quick starts and the window search gave 1.36."""
    graph = build_paper_graph("resnet18_cifar")
    costs, peak, footprint = setup(graph, "m4")
    budget = int(footprint + 0.1 * (peak - footprint))
    options = MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=1.05)
    bound_j, schedules, _ = interval_start(graph, costs, options, time_limit_s=60)
    energies = []
    for schedule in schedules:  # the one at the exact budget may exceed it inside a stage's recomputation
        try:
            energies.append(simulate(schedule, graph, costs, ram_budget_bytes=budget, runtime_budget_s=1.05 * costs.plain_step_runtime_s).energy_j)
        except InvalidScheduleError:
            continue
    assert energies and max(bound_j, eviction_bound(graph, costs, options)) <= min(energies) < 1.2 * costs.plain_step_energy_j


def test_interval_bound_certifies_vgg16_cifar_where_the_eviction_bound_leaves_a_gap():
    """vgg16_cifar on m4, 10% of the way, 1.05x: the eviction bound is 1.001933 plain steps; the interval
    relaxation, solved exactly, proves 1.002075, the energy of the schedule its solution makes (the
    optimum the stage relaxation certified before, docs/solve.md)."""
    graph = build_paper_graph("vgg16_cifar")
    costs, peak, footprint = setup(graph, "m4")
    budget = int(footprint + 0.1 * (peak - footprint))
    options = MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=1.05)
    found = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-6)
    assert found.optimal and found.bound_j / costs.plain_step_energy_j == pytest.approx(1.002075 - HIGHS_ABS_GAP, abs=1e-6)
    assert found.bound_j > eviction_bound(graph, costs, options) * (1 + 1e-5)
    sim = simulate(found.schedule, graph, costs, ram_budget_bytes=budget, runtime_budget_s=1.05 * costs.plain_step_runtime_s)
    assert sim.energy_j == pytest.approx(found.bound_j, rel=1e-6)


MAPPED_SLOW = [pytest.param(*case, marks=pytest.mark.slow) for case in [(model, platform, 0.0, levers) for model, platform, levers in SMALLEST] + OTHERS]


@pytest.mark.parametrize("model,platform,fraction,levers", QUICK + MAPPED_SLOW)
def test_an_exact_optimum_is_a_point_of_the_relaxation_at_no_more_than_its_energy(model, platform, fraction, levers):
    """NOTE 5, 7 and 8's map (NOTE 10), checked on POET's exact optima: the schedule's point meets every row of the
    relaxation (idle-gap and kept-through rows included) at no more than the schedule's energy."""
    levers = LEVERS[levers]
    graph = GRAPHS[model]()
    costs, peak, footprint = setup(graph, platform)
    extra = 2 * graph.param_bytes if levers.get("params_in_budget") else 0
    options = MilpOptions(ram_budget_bytes=int(footprint + fraction * (peak - footprint)) + extra, runtime_budget_factor=1.2, **levers)
    milp = build_milp(graph, costs, options)
    exact = run_milp(milp, solver="highs", mip_gap=1e-7, threads=1, time_limit_s=120)
    if exact.status == "infeasible":
        return
    assert exact.status == "optimal" and exact.x is not None
    m = milp.decode(exact.x)
    schedule = Schedule.from_matrices(graph, m["R"], m["S_RAM"], m.get("S_SSD"), m.get("M_IN"), m.get("M_OUT"), prefetch=options.charge_pagein)
    energy = simulate(schedule, graph, costs).energy_j
    value = interval_value(graph, costs, options, schedule)
    assert value is not None and costs.plain_step_energy_j <= value <= energy * (1 + 1e-9)


@pytest.mark.parametrize("model,platform,fraction", [("convnet", "m4", 0.2), ("linear", "m4", 0.1), ("residual", "m0", 0.2), ("relu_chain", "m4", 0.05)])
def test_a_fitting_schedule_of_the_milp_maps_to_a_point_of_the_relaxation_at_no_more_than_its_energy(model, platform, fraction):
    """Every quick start that replays within both budgets and is a solution of POET's MILP (NOTE 4's ``fits_milp``; DTR's
    frees one stage late are not) maps to a point that meets every row of the relaxation (with the idle-gap and kept-through
    rows and without them) at no more than its simulated energy: the start that ``interval_bound`` is given (NOTE 13)."""
    from poetlab.planners.poet.neighbourhood import fits_milp
    from poetlab.planners.poet.starts import best_start

    graph = GRAPHS[model]()
    costs, peak, footprint = setup(graph, platform)
    options = MilpOptions(ram_budget_bytes=int(footprint + fraction * (peak - footprint)), runtime_budget_factor=1.2)
    runtime = 1.2 * costs.plain_step_runtime_s

    def replay(schedule):
        return simulate(schedule, graph, costs, ram_budget_bytes=options.ram_budget_bytes, runtime_budget_s=runtime)

    fitting = []
    best_start(graph, costs, options, runtime, replay, covers_s=2.0, collect=fitting)
    model_ = build_milp(graph, costs, options)
    mapped = 0
    for schedule, sim in fitting:
        if not fits_milp(model_, schedule):
            continue
        for rows in ({"gap_rows": True, "kept_rows": True}, {"gap_rows": False, "kept_rows": False}):
            value = interval_value(graph, costs, options, schedule, **rows)
            assert value is not None and costs.plain_step_energy_j <= value <= sim.energy_j * (1 + 1e-9)
        mapped += 1
    assert mapped >= 1


def test_the_relaxations_own_schedule_maps_back_to_its_point_at_exactly_its_energy():
    """Five convolutions on m4 at the smallest footprint, 2x (NOTE 8): the relaxation's optimum made into a schedule replays
    within both budgets at the optimum, and mapped back (:func:`interval_point`) it is a point of the relaxation whose
    objective equals its simulated energy (the map is exact where no tensor is regenerated twice in one interval)."""
    graph = convnet(depth=5)
    costs, _, footprint = setup(graph, "m4")
    options = MilpOptions(ram_budget_bytes=footprint, runtime_budget_factor=2.0)
    problem = with_gap_rows(graph, _build(graph, costs, options))
    found = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, gap_rows=True)
    assert found.optimal and found.schedule is not None
    sim = simulate(found.schedule, graph, costs, ram_budget_bytes=footprint, runtime_budget_s=2.0 * costs.plain_step_runtime_s)
    x = interval_point(graph, problem, found.schedule)
    assert x is not None and _meets_rows(problem, x)
    assert costs.plain_step_energy_j * (1 + problem.cost @ x) == pytest.approx(sim.energy_j, rel=1e-9) == pytest.approx(found.bound_j, rel=1e-6)
    assert interval_schedule(graph, problem, x > 0.5) is not None


def test_a_start_makes_highs_begin_at_its_energy_and_the_bound_stays_a_bound():
    """``interval_bound(start=...)`` (highspy, NOTE 13) on the ten-ReLU chain at 5%: from the exact optimum's schedule the
    relaxation's best solution is never above it, the bound is the same as scipy's without a start (both solved exactly),
    and a ``target_j`` at the eviction bound stops the solve as soon as its dual bound reaches it."""
    graph = relu_chain(10)
    costs, peak, footprint = setup(graph, "m4")
    options = MilpOptions(ram_budget_bytes=int(footprint + 0.05 * (peak - footprint)), runtime_budget_factor=1.2)
    milp = build_milp(graph, costs, options)
    exact = run_milp(milp, solver="highs", mip_gap=1e-7, threads=1)
    m = milp.decode(exact.x)
    optimum = Schedule.from_matrices(graph, m["R"], m["S_RAM"], m.get("S_SSD"), m.get("M_IN"), m.get("M_OUT"))
    energy = simulate(optimum, graph, costs).energy_j
    plain = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, gap_rows=True)
    warm = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, gap_rows=True, start=optimum)
    assert plain.optimal and warm.optimal
    assert warm.bound_j == pytest.approx(plain.bound_j, abs=2 * HIGHS_ABS_GAP * costs.plain_step_energy_j) and warm.bound_j <= energy * (1 + 1e-7)
    assert warm.incumbent is not None and warm.incumbent * costs.plain_step_energy_j <= energy * (1 + 1e-9)
    target = eviction_bound(graph, costs, options)
    stopped = interval_bound(graph, costs, options, time_limit_s=60, mip_gap=1e-9, gap_rows=True, start=optimum, target_j=target)
    assert target * (1 - 1e-8) <= stopped.bound_j <= plain.bound_j * (1 + 1e-7)

"""Capuchin and DTR on the one simulator: valid under the budget, swap only where free time hides the
copy, recompute otherwise, never better than the MILP's optimum, one-line reasons when they cannot."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from poetlab import CostModel, checkpoint_all_schedule, simulate, solve
from poetlab.planners.baselines.base import Budgets, CannotMeetBudget
from poetlab.planners.baselines import capuchin, dtr
from poetlab.core.graph import min_footprint_bytes

from small_graphs import relu_chain as chain
from baseline_checks import between_footprint_and_peak, check_valid, setup

PLANNERS = {
    "capuchin": capuchin.plan,
    "capuchin_swap_sources": capuchin.plan_swap_sources,
    "dtr": dtr.plan,
    "dtr_local": dtr.plan_local,
    "dtr_pinned": dtr.plan_pinned,
}
DEFAULT_PLANNERS = {"capuchin": capuchin.plan, "dtr": dtr.plan}


def uniform_costs(graph, paging_s: float) -> CostModel:
    """One second and one joule per node; each page-in or page-out ``paging_s`` seconds and joules."""
    T = graph.n_nodes
    paging = np.full(T, paging_s)
    return CostModel("uniform", np.ones(T), np.ones(T), paging, paging, paging, paging)


# ---- valid under the budget --------------------------------------------------------------------
@pytest.mark.parametrize("method", list(DEFAULT_PLANNERS))
@pytest.mark.parametrize("fraction", [0.6, 0.8])
def test_resnet18_cifar_a72_fits_60_and_80_percent_of_checkpoint_all(method, fraction):
    graph, costs, reference = setup("resnet18_cifar", "a72")
    budgets = Budgets(int(fraction * reference.peak_ram_bytes), 2.0)
    sim = check_valid(DEFAULT_PLANNERS[method](graph, costs, budgets), graph, costs, budgets)
    assert sim.peak_ram_bytes < reference.peak_ram_bytes
    assert sim.energy_j > reference.energy_j  # it had to recompute or page something
    if method == "dtr":
        assert sim.n_recomputes > 0 and sim.n_pageouts == sim.n_pageins == 0


@pytest.mark.parametrize("name,platform", [("mlp", "m0"), ("residual", "a72"), ("linear", "m0"), ("linear", "a72")])
@pytest.mark.parametrize("method", list(PLANNERS))
def test_small_graphs_fit_or_say_why(name, platform, method):
    """Between the smallest footprint and checkpoint-all's peak every schedule is valid; the default
    planners always find one half-way up; a refusal is one line that names the method."""
    graph, costs, reference = setup(name, platform)
    for fraction in (0.0, 0.5, 0.75):
        budgets = Budgets(between_footprint_and_peak(graph, reference, fraction), 3.0)
        try:
            schedule = PLANNERS[method](graph, costs, budgets)
        except CannotMeetBudget as exc:
            assert str(exc).startswith(method.split("_")[0] + ": ") and len(str(exc).splitlines()) == 1
            assert not (method in DEFAULT_PLANNERS and fraction >= 0.5), str(exc)
            continue
        check_valid(schedule, graph, costs, budgets)


# ---- at checkpoint-all's peak both are checkpoint-all ----------------------------------------
@pytest.mark.parametrize("name,platform", [("mlp", "m0"), ("residual", "a72"), ("linear", "m0"), ("resnet18_cifar", "a72")])
@pytest.mark.parametrize("method", list(DEFAULT_PLANNERS))
def test_at_checkpoint_all_peak_nothing_is_evicted(name, platform, method):
    graph, costs, reference = setup(name, platform)
    budgets = Budgets(reference.peak_ram_bytes, 1.0)
    sim = check_valid(DEFAULT_PLANNERS[method](graph, costs, budgets), graph, costs, budgets)
    assert sim.energy_j == pytest.approx(reference.energy_j, rel=1e-12)
    assert sim.n_recomputes == sim.n_pageouts == sim.n_pageins == 0


# ---- Capuchin ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fraction", [0.6, 0.8])
def test_capuchin_swaps_when_the_copy_hides_under_compute(fraction):
    graph = chain(8)
    costs = uniform_costs(graph, 0.01)  # 10 ms copies, 1 s nodes: every idle interval hides a swap
    reference = simulate(checkpoint_all_schedule(graph), graph, costs)
    budgets = Budgets(int(fraction * reference.peak_ram_bytes), 1.0)
    plan = capuchin.plan_evictions(graph, costs, budgets.ram_bytes)
    assert plan.evictions and all(e.mode is capuchin.Mode.SWAP and e.free_time_s > 0 for e in plan.evictions)
    sim = check_valid(plan.schedule, graph, costs, budgets)  # runtime factor 1: no recomputation
    assert sim.n_recomputes == 0 and sim.n_pageouts == len(plan.evictions) == sim.n_pageins
    # the largest free time first: the earliest forward activations, idle the longest
    assert [e.free_time_s for e in plan.evictions] == sorted((e.free_time_s for e in plan.evictions), reverse=True)
    assert capuchin.plan(graph, costs, budgets) == plan.schedule


@pytest.mark.parametrize("fraction", [0.6, 0.8])
def test_capuchin_recomputes_when_the_copy_cannot_hide(fraction):
    graph = chain(8)
    costs = uniform_costs(graph, 100.0)  # 100 s copies, 1 s nodes: FT < 0 and recomputing stalls less
    reference = simulate(checkpoint_all_schedule(graph), graph, costs)
    budgets = Budgets(int(fraction * reference.peak_ram_bytes), None)
    plan = capuchin.plan_evictions(graph, costs, budgets.ram_bytes)
    assert plan.evictions and all(e.mode is capuchin.Mode.RECOMPUTE and e.free_time_s <= 0 for e in plan.evictions)
    sim = check_valid(plan.schedule, graph, costs, budgets)
    assert sim.n_recomputes > 0 and sim.n_pageouts == sim.n_pageins == 0


def test_capuchin_on_real_platforms_swaps_long_idle_tensors_and_recomputes_short_ones():
    # resnet18_cifar on a72: forward activations sit idle through the rest of the forward pass, long
    # enough to hide their copies to the SD card
    graph, costs, reference = setup("resnet18_cifar", "a72")
    plan = capuchin.plan_evictions(graph, costs, 0.6 * reference.peak_ram_bytes)
    assert plan.evictions and all(e.mode is capuchin.Mode.SWAP and e.free_time_s > 0 for e in plan.evictions)
    assert simulate(plan.schedule, graph, costs).n_recomputes == 0
    # on the small residual graph no idle interval covers a copy: it recomputes
    graph, costs, reference = setup("residual", "a72")
    plan = capuchin.plan_evictions(graph, costs, between_footprint_and_peak(graph, reference, 0.25))
    assert plan.evictions and all(e.mode is capuchin.Mode.RECOMPUTE for e in plan.evictions)
    prof = capuchin.profile(graph, costs)
    for e in plan.evictions:
        assert capuchin.swap_eviction(prof, costs, e.tensor, e.evicted_access, e.back_access).free_time_s <= 0


def test_capuchin_swap_timing_follows_free_time():
    graph = chain(8)
    costs = uniform_costs(graph, 0.4)
    prof = capuchin.profile(graph, costs)
    # tensor 1 is read by node 2 (forward) and next by its gradient node; 1 s stages
    a, b = 2, prof.accesses[1][2]
    swap = capuchin.swap_eviction(prof, costs, 1, a, b)
    assert swap.free_time_s == pytest.approx((b - a - 1) - 0.8)
    assert swap.out_stage == a + 1  # the copy out ends 0.4 s into stage a + 1
    assert swap.in_stage == b - 1  # the copy in starts 0.4 s before b: during stage b - 1
    stall = capuchin.swap_eviction(prof, uniform_costs(graph, 100.0), 1, a, b)
    assert stall.free_time_s < 0 and (stall.out_stage, stall.in_stage) == (a, b)


# ---- never better than the MILP --------------------------------------------------------------
@pytest.mark.parametrize(
    "name,platform", [("mlp", "m0"), ("residual", "a72"), pytest.param("linear", "m0", marks=pytest.mark.slow)]
)
def test_no_dynamic_method_beats_the_milp_optimum(name, platform):
    graph, costs, reference = setup(name, platform)
    feasible = Counter()
    for fraction in (0.0, 0.25, 0.5):
        budgets = Budgets(between_footprint_and_peak(graph, reference, fraction), 3.0)
        optimum = solve(graph, costs, budgets.ram_bytes, budgets.runtime_factor, mip_gap=0)
        assert optimum.status == "optimal"
        for method, planner in PLANNERS.items():
            try:
                schedule = planner(graph, costs, budgets)
            except CannotMeetBudget:
                continue
            sim = check_valid(schedule, graph, costs, budgets)
            assert sim.energy_j >= optimum.energy_j * (1 - 1e-9), (method, fraction)
            feasible[method] += 1
    assert feasible["dtr"] == 3 and feasible["capuchin"] >= 2


# ---- one-line reasons ------------------------------------------------------------------------
@pytest.mark.parametrize("method", list(PLANNERS))
def test_below_the_smallest_footprint_they_say_so_in_one_line(method):
    graph, costs, _ = setup("linear", "m0")
    footprint, node = min_footprint_bytes(graph)
    with pytest.raises(CannotMeetBudget) as info:
        PLANNERS[method](graph, costs, Budgets(footprint - 1, 2.0))
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(method.split("_")[0] + ": ") and f"{footprint:,} bytes" in message
    assert graph.nodes[node].name in message


@pytest.mark.parametrize("method", list(DEFAULT_PLANNERS))
def test_runtime_budget_is_respected(method):
    graph, costs, reference = setup("residual", "a72")
    ram = between_footprint_and_peak(graph, reference, 0.25)
    with pytest.raises(CannotMeetBudget) as info:
        DEFAULT_PLANNERS[method](graph, costs, Budgets(ram, 1.0))
    message = str(info.value)
    assert len(message.splitlines()) == 1 and message.startswith(f"{method}: ") and "runtime budget" in message
    # with room in the runtime budget the same RAM budget is met
    check_valid(DEFAULT_PLANNERS[method](graph, costs, Budgets(ram, 2.0)), graph, costs, Budgets(ram, 2.0))


def test_capuchin_says_when_nothing_idle_is_left():
    graph, costs, reference = setup("linear", "m0")
    footprint, _ = min_footprint_bytes(graph)
    with pytest.raises(CannotMeetBudget) as info:
        capuchin.plan_swap_sources(graph, costs, Budgets(footprint, None))
    message = str(info.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("capuchin: peak ") and "no tensor idle across it is left to swap or recompute" in message

"""POFO against the MILP on chains; and, for both chain planners (POFO and revolve), budgets and branchy
graphs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from poetlab import CostModel, build_paper_graph, checkpoint_all_schedule, load_platform, simulate, solve
from poetlab.planners.baselines import pofo, revolve
from poetlab.planners.baselines.base import Budgets, CannotMeetBudget, PlanOptions
from poetlab.core.graph import TrainingGraph
from poetlab.planners.poet.milp import MilpOptions, build_milp
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import Schedule
from poetlab.planners.poet.backends import run_milp
from poetlab.planners.transfer_order import issue_for_overlap

from small_graphs import mlp, relu_chain as chain, residual

PLANNERS = {"revolve": revolve.plan, "pofo": pofo.plan}


def _costs(graph: TrainingGraph, platform: str) -> CostModel:
    return CostModel.from_flops(graph, load_platform(platform))


def _peak(graph: TrainingGraph, costs: CostModel) -> int:
    return simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes


# ---- POFO against the MILP ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "graph_factory,platform,budget,uses_paging",
    [
        (lambda: chain(6), "m0", 496, False),
        (lambda: chain(6), "m0", 416, False),
        (lambda: chain(6), "m0", 336, False),
        (lambda: chain(8), "m0", 480, False),
        (lambda: build_paper_graph("linear"), "m0", 3672, True),
        (lambda: build_paper_graph("linear"), "m0", 3256, True),  # the smallest single-node footprint
    ],
)
def test_pofo_equals_the_milp_optimum_on_chains(graph_factory, platform, budget, uses_paging):
    graph = graph_factory()
    costs = _costs(graph, platform)
    assert budget < _peak(graph, costs)  # checkpoint-all does not fit: the MILP is solved
    optimum = solve(graph, costs, budget, None, mip_gap=0)
    assert optimum.status == "optimal" and optimum.solver != "bound"
    result = pofo.solve_pofo(graph, costs, Budgets(budget))
    assert result.simulation.energy_j == pytest.approx(optimum.energy_j, rel=1e-6)
    assert result.simulation.energy_j == pytest.approx(costs.plain_step_energy_j + result.predicted_extra, rel=1e-9)
    assert result.simulation.n_recomputes > 0
    assert (result.simulation.n_pageouts > 0) == uses_paging


def _milp_point(graph: TrainingGraph, costs: CostModel, schedule: Schedule, options: MilpOptions):
    """The MILP's solution vector for ``schedule``, its largest constraint violation, its objective."""
    model = build_milp(graph, costs, options)
    matrices = schedule.matrices().as_dict()
    for name, index in model.index.items():  # no variable the MILP does not have
        assert not (matrices[name][: graph.n_nodes] & (index < 0)).any(), name
    x = model.encode(matrices)
    Ax = model.A @ x
    violation = max(np.max(model.row_lower - Ax), np.max(Ax - model.row_upper), np.max(model.col_lower - x), np.max(x - model.col_upper))
    return model, x, violation, float(model.c @ x)


@pytest.mark.parametrize(
    "name,budget,runtime_factor", [("chain6", 416, None), ("chain8", 256, 1.1), ("chain8", 390, 1.05), ("linear", 3256, None)]
)
def test_pofo_schedules_are_feasible_points_of_the_milp(name, budget, runtime_factor):
    """POFO follows the MILP's stage rules, so it can never beat the MILP's true optimum."""
    graph = chain(int(name[5:])) if name.startswith("chain") else build_paper_graph(name)
    costs = _costs(graph, "a72")
    schedule = pofo.plan(graph, costs, Budgets(budget, runtime_factor))
    sim = simulate(schedule, graph, costs, ram_budget_bytes=budget, runtime_budget_s=Budgets(budget, runtime_factor).runtime_s(costs))
    _, _, violation, objective = _milp_point(graph, costs, schedule, MilpOptions(budget, runtime_factor))
    assert violation <= 1e-9
    assert objective == pytest.approx(sim.energy_j, rel=1e-12)
    replayed = simulate(Schedule.from_matrices(graph, **schedule.matrices().as_dict()), graph, costs)
    assert replayed.peak_ram_bytes == sim.peak_ram_bytes
    assert replayed.energy_j == pytest.approx(sim.energy_j, rel=1e-12)


def test_pofo_equals_the_milp_optimum_once_the_objective_is_scaled():
    """On the A72, node energies (~1e-7 J) sit below the solvers' optimality tolerances, and
    ``solve`` can stop above the optimum; with the objective in units of one plain step it does not."""
    graph = chain(6)
    costs = _costs(graph, "a72")
    budget = 416
    pofo_energy = simulate(pofo.plan(graph, costs, Budgets(budget)), graph, costs).energy_j
    model = build_milp(graph, costs, MilpOptions(budget))
    scaled = dataclasses.replace(model, c=model.c / costs.plain_step_energy_j)
    answer = run_milp(scaled, solver="highs", time_limit_s=60, mip_gap=0)
    assert answer.status == "optimal"
    assert answer.objective * costs.plain_step_energy_j == pytest.approx(pofo_energy, rel=1e-9)
    assert solve(graph, costs, budget, None, mip_gap=0).energy_j >= pofo_energy * (1 - 1e-9)


def test_pofo_pages_when_nothing_may_be_recomputed():
    graph = chain(8)
    costs = _costs(graph, "m0")
    footprint, _ = min_footprint_bytes(graph)
    budgets = Budgets(footprint, 1.0)
    sim = simulate(pofo.plan(graph, costs, budgets), graph, costs, ram_budget_bytes=footprint, runtime_budget_s=budgets.runtime_s(costs))
    assert sim.n_pageouts > 0 and sim.n_pageins >= sim.n_pageouts
    assert sim.compute_time_s == pytest.approx(costs.plain_step_runtime_s, rel=1e-12)  # only free recomputations
    unlimited = simulate(pofo.plan(graph, costs, Budgets(footprint)), graph, costs)
    assert unlimited.n_pageouts == 0 and unlimited.energy_j < sim.energy_j  # recomputing is cheaper on the M0


def test_pofo_with_coarse_slots_still_fits(monkeypatch):
    graph = build_paper_graph("linear")
    costs = _costs(graph, "a72")
    budget = 3672
    exact = pofo.solve_pofo(graph, costs, Budgets(budget))
    assert exact.slots.unit == 8  # the gcd of the tensor sizes
    monkeypatch.setattr(pofo, "MAX_CELLS", 20_000)
    coarse = pofo.solve_pofo(graph, costs, Budgets(budget))
    assert coarse.slots.unit > 8
    assert coarse.simulation.peak_ram_bytes <= budget
    assert coarse.simulation.energy_j >= exact.simulation.energy_j * (1 - 1e-12)


# ---- both planners: budgets and graphs ------------------------------------------------------------
@pytest.mark.parametrize("method", PLANNERS)
@pytest.mark.parametrize("graph_factory,platform", [(lambda: chain(8), "a72"), (mlp, "m0"), (lambda: build_paper_graph("linear"), "a72")])
def test_every_schedule_fits_its_budgets(method, graph_factory, platform):
    graph = graph_factory()
    costs = _costs(graph, platform)
    peak = _peak(graph, costs)
    footprint, _ = min_footprint_bytes(graph)
    fitted = 0
    for fraction in (1.0, 0.7, 0.4, 0.0):
        for runtime_factor in (None, 1.5):
            budgets = Budgets(int(footprint + fraction * (peak - footprint)), runtime_factor)
            try:
                schedule = PLANNERS[method](graph, costs, budgets)
            except CannotMeetBudget as exc:
                assert str(exc).startswith(f"{method}: ") and "\n" not in str(exc)
                continue
            sim = simulate(schedule, graph, costs, ram_budget_bytes=budgets.ram_bytes, runtime_budget_s=budgets.runtime_s(costs))
            assert sim.energy_j >= costs.plain_step_energy_j * (1 - 1e-12)
            if fraction == 1.0:
                assert sim.energy_j == pytest.approx(costs.plain_step_energy_j, rel=1e-12)
            fitted += 1
    assert fitted >= 2


@pytest.mark.parametrize("method", PLANNERS)
@pytest.mark.parametrize("graph_factory", [lambda: chain(5), mlp, residual, lambda: build_paper_graph("linear")])
def test_planners_refuse_a_budget_below_the_smallest_footprint(method, graph_factory):
    graph = graph_factory()
    costs = _costs(graph, "a72")
    footprint, _ = min_footprint_bytes(graph)
    with pytest.raises(CannotMeetBudget, match=rf"^{method}: ") as info:
        PLANNERS[method](graph, costs, Budgets(footprint - 1, 2.0))
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("method", PLANNERS)
def test_planners_on_the_residual_graph(method):
    graph = residual()
    costs = _costs(graph, "a72")
    peak = _peak(graph, costs)
    outcomes = []
    for budget in (peak, int(0.8 * peak), int(0.6 * peak)):
        try:
            schedule = PLANNERS[method](graph, costs, Budgets(budget))
        except CannotMeetBudget as exc:
            assert str(exc).startswith(f"{method}: ") and "\n" not in str(exc)
            outcomes.append(None)
            continue
        outcomes.append(simulate(schedule, graph, costs, ram_budget_bytes=budget).energy_j)
    assert outcomes[0] is not None  # at checkpoint-all's peak there is a schedule
    if method == "pofo":  # the tape of the block may be kept: checkpoint-all's energy
        assert outcomes[0] == pytest.approx(costs.plain_step_energy_j, rel=1e-12)
    else:  # revolve re-tapes every block but the last
        assert outcomes[0] > costs.plain_step_energy_j


@pytest.mark.parametrize("method", PLANNERS)
def test_planners_on_resnet18_cifar(method):
    graph = build_paper_graph("resnet18_cifar")
    costs = _costs(graph, "a72")
    budget = 0.6 * _peak(graph, costs)
    sim = simulate(PLANNERS[method](graph, costs, Budgets(budget)), graph, costs, ram_budget_bytes=budget)
    assert sim.n_recomputes > 0
    assert costs.plain_step_energy_j < sim.energy_j < 2 * costs.plain_step_energy_j


@pytest.mark.parametrize("method", PLANNERS)
def test_planners_take_the_shared_planner_signature(method):
    graph = chain(4)
    costs = _costs(graph, "a72")
    budgets = Budgets(_peak(graph, costs))
    assert PLANNERS[method](graph, costs, budgets, PlanOptions(time_limit_s=1.0)) == PLANNERS[method](graph, costs, budgets)


def test_graphs_that_are_not_chains_of_blocks_are_refused():
    graph = chain(3)
    nodes = list(graph.nodes)
    first_backward = len(graph.forward_indices)
    last = nodes[-1]
    nodes[-1] = dataclasses.replace(last, inputs=(*last.inputs, first_backward))  # a gradient two steps back
    odd = TrainingGraph("odd", tuple(nodes))
    costs = _costs(odd, "a72")
    for method, planner in PLANNERS.items():
        with pytest.raises(CannotMeetBudget, match=rf"^{method}: not a chain of blocks \(.*gradient"):
            planner(odd, costs, Budgets(1e9))


def test_pofo_has_no_memory_grid_artefact_at_the_smallest_footprint():
    """VGG-16 (ImageNet) at its smallest footprint: the DP's grid is coarse (slots of 21,427 bytes, sizes
    rounded up), so on the budget's own slots it finds nothing; one slot of slack finds a plan whose
    replayed peak is within the true budget in bytes."""
    from poetlab.planners.baselines.revolve import planning_chain

    graph = build_paper_graph("vgg16")
    costs = CostModel.from_flops(graph, load_platform("jetsontx2"))
    footprint, _ = min_footprint_bytes(graph)
    budgets = Budgets(footprint, 2.0)
    slots = pofo.memory_slots(graph, planning_chain("pofo", graph, budgets), footprint)
    assert slots.unit > math.gcd(*(int(b) for b in graph.output_bytes))  # a coarse grid
    with pytest.raises(CannotMeetBudget):
        pofo.solve_on_grid(graph, costs, budgets, planning_chain("pofo", graph, budgets), slots, "energy")
    found = pofo.solve_pofo(graph, costs, budgets)
    assert found.slots.budget > slots.budget and found.simulation.peak_ram_bytes <= footprint
    assert simulate(found.schedule, graph, costs, ram_budget_bytes=footprint).energy_j == found.simulation.energy_j


@pytest.mark.parametrize("platform", ["m4", "jetsontx2"])
def test_pofo_as_published_minimizes_time_not_energy(platform):
    """The same DP with a time objective (step time, transfers at the platform's bandwidth, here charged
    in full so that the simulator's serial time is its measure) against the kit's energy objective: each
    is no worse than the other on its own measure, both within budget."""
    graph = chain(6)
    costs = _costs(graph, platform)
    footprint, _ = min_footprint_bytes(graph)
    budgets = Budgets(footprint + 0.3 * (_peak(graph, costs) - footprint))
    by_time = pofo.solve_pofo(graph, costs, budgets, objective="time_serial").simulation
    by_energy = pofo.solve_pofo(graph, costs, budgets, objective="energy").simulation
    assert by_time.runtime_s <= by_energy.runtime_s * (1 + 1e-12) and by_energy.energy_j <= by_time.energy_j * (1 + 1e-12)
    assert max(by_time.peak_ram_bytes, by_energy.peak_ram_bytes) <= budgets.ram_bytes
    assert pofo.plan_time(graph, costs, budgets) == pofo.solve_pofo(graph, costs, budgets, objective="time").schedule


# ---- POFO's choices under its overlapped transfer model ---------------------------------------------
def _one_second_nodes(graph: TrainingGraph, page_s: float) -> CostModel:
    """Every node 1 s (and 1 J), every page-out and page-in ``page_s`` seconds."""
    ones, page = np.ones(graph.n_nodes), np.full(graph.n_nodes, page_s)
    return CostModel("hand", ones, ones, page, page, page, page)


def _reissued_time(result: pofo.PofoResult, graph: TrainingGraph, costs: CostModel, budget: float) -> float:
    return issue_for_overlap(result.schedule, graph, costs, budget).timing.runtime_s


def test_overlap_turns_pofo_from_recomputing_to_paging():
    """relu_chain(3) (input 0, relus 1-3, loss 4, gradients 5-8, all 64 bytes, 1 s each) in 320 bytes:
    five tensors, one fewer than the step keeps. Pages take 0.75 s each way.

    Charged in full (the serial DP), paging the input costs 1.5 s and recomputing a relu 1 s, so it
    drops relu 1 and recomputes it for its gradient: 9 + 1 = 10 s either way it is read. With the
    transfers beside the computations (POFO as published), the input's page-out runs beside relu 1
    (1-1.75 s, the input freed at 2 s) and its page-in beside relu 1's gradient (7-7.75 s, with the input,
    relus 1 and 2, the gradients 6 and 7 in RAM: 320 bytes), so paging costs nothing: 9 s, which the DP
    predicts; read serially the same schedule takes 10.5 s."""
    graph = chain(3)
    costs = _one_second_nodes(graph, 0.75)
    serial = pofo.solve_pofo(graph, costs, Budgets(320), objective="time_serial")
    assert (serial.simulation.n_recomputes, serial.simulation.n_pageouts) == (1, 0)
    assert serial.simulation.runtime_s == _reissued_time(serial, graph, costs, 320) == pytest.approx(10.0)
    published = pofo.solve_pofo(graph, costs, Budgets(320), objective="time")
    assert (published.simulation.n_recomputes, published.simulation.n_pageouts) == (0, 1)
    assert _reissued_time(published, graph, costs, 320) == pytest.approx(9.0)
    assert costs.plain_step_runtime_s + published.predicted_extra == pytest.approx(9.0)
    assert published.simulation.runtime_s == pytest.approx(10.5) and published.simulation.peak_ram_bytes <= 320
    assert pofo.plan_time(graph, costs, Budgets(320)) == published.schedule


def test_overlap_pages_the_input_even_when_its_page_in_waits():
    """relu_chain(2) in 256 bytes (four tensors): relu 1's gradient holds relus 1 and 2 and the gradients
    4 and 5, so the input's page-in cannot run beside it and is waited for (6-6.75 s), its page-out
    hidden beside relu 1. Paging costs 0.75 s, recomputing the input 1 s: the published DP pages (7.75 s,
    as predicted), the serial DP (1.5 s against 1 s) recomputes (8 s)."""
    graph = chain(2)
    costs = _one_second_nodes(graph, 0.75)
    serial = pofo.solve_pofo(graph, costs, Budgets(256), objective="time_serial")
    published = pofo.solve_pofo(graph, costs, Budgets(256), objective="time")
    assert (serial.simulation.n_recomputes, serial.simulation.n_pageouts) == (1, 0)
    assert (published.simulation.n_recomputes, published.simulation.n_pageouts) == (0, 1)
    assert _reissued_time(serial, graph, costs, 256) == pytest.approx(8.0)
    assert _reissued_time(published, graph, costs, 256) == costs.plain_step_runtime_s + published.predicted_extra == pytest.approx(7.75)


def test_a_page_out_holds_its_memory_until_it_ends():
    """relu_chain(3) in 320 bytes with 1.2 s pages: the DP prices the page-out beside relu 1 (0.2 s
    waited) and the page-in beside relu 1's gradient (0.2 s waited): 9.4 s against 10 s for recomputing,
    so it pages. Reissued, the input's free moves past relu 2, as the page-out (1-2.2 s) still holds the
    input's memory at 2 s, and the page-in runs beside relu 1's gradient: 9.2 s, within the DP's price."""
    graph = chain(3)
    costs = _one_second_nodes(graph, 1.2)
    published = pofo.solve_pofo(graph, costs, Budgets(320), objective="time")
    assert published.simulation.n_pageouts == 1
    assert costs.plain_step_runtime_s + published.predicted_extra == pytest.approx(9.4)
    plan = issue_for_overlap(published.schedule, graph, costs, 320)
    order = [(op.kind.name, op.node) for op in plan.schedule.ops]
    assert order.index(("FREE", 0)) > order.index(("COMPUTE", 2))
    assert plan.timing.runtime_s == pytest.approx(9.2) and plan.simulation.peak_ram_bytes == 320


@pytest.mark.parametrize("platform", ["m4", "jetsontx2"])
def test_the_overlapped_price_is_never_above_the_serial_one(platform):
    """Every plan's overlapped price is at most its serial one, so the published DP's optimum is too; on
    the paper's linear model at its smallest footprint both replay within the budget."""
    graph = build_paper_graph("linear")
    costs = _costs(graph, platform)
    footprint, _ = min_footprint_bytes(graph)
    serial = pofo.solve_pofo(graph, costs, Budgets(footprint), objective="time_serial")
    published = pofo.solve_pofo(graph, costs, Budgets(footprint), objective="time")
    assert published.predicted_extra <= serial.predicted_extra * (1 + 1e-12)
    assert max(serial.simulation.peak_ram_bytes, published.simulation.peak_ram_bytes) <= footprint


def test_pofo_plans_table_3s_smallest_budget():
    """ResNet-18 on the TX2 at its smallest footprint (Table 3's smallest budget): the grid of that budget
    (slots of 5,958 bytes, sizes rounded up) finds no plan; a slot of slack finds one whose replayed
    peak is within the budget in bytes, so POFO has a schedule there."""
    from poetlab.planners.baselines.revolve import planning_chain

    graph = build_paper_graph("resnet18")
    costs = CostModel.from_flops(graph, load_platform("jetsontx2"))
    footprint, _ = min_footprint_bytes(graph)
    budgets = Budgets(footprint, 2.0)
    chain_ = planning_chain("pofo", graph, budgets)
    slots = pofo.memory_slots(graph, chain_, footprint)
    with pytest.raises(CannotMeetBudget):
        pofo.solve_on_grid(graph, costs, budgets, chain_, slots, "time")
    found = pofo.solve_pofo(graph, costs, budgets, objective="time")
    assert found.slots.budget > slots.budget and found.simulation.peak_ram_bytes <= footprint


def test_an_unknown_objective_is_refused():
    graph = chain(2)
    with pytest.raises(ValueError, match="objective must be one of"):
        pofo.solve_pofo(graph, _one_second_nodes(graph, 1.0), Budgets(320), objective="makespan")


@pytest.mark.slow
def test_on_table_3s_budgets_the_published_dp_is_no_slower_under_overlap():
    """ResNet-18 on the TX2 at Table 3's three budgets: POFO choosing with its transfers beside compute is,
    reissued for overlap, no slower than POFO choosing with them charged in full, and within its own
    price (the replay may hide more than the DP's windows)."""
    from poetlab.planners.comparison import budget_ladder

    graph = build_paper_graph("resnet18")
    costs = CostModel.from_flops(graph, load_platform("jetsontx2"))
    for ram in budget_ladder(graph, costs, (0.6, 0.3, 0.0)):
        budgets = Budgets(ram, 2.0)
        published = pofo.solve_pofo(graph, costs, budgets, objective="time")
        serial = pofo.solve_pofo(graph, costs, budgets, objective="time_serial")
        reissued = _reissued_time(published, graph, costs, ram)
        assert reissued <= _reissued_time(serial, graph, costs, ram) * (1 + 1e-12)
        assert reissued <= (costs.plain_step_runtime_s + published.predicted_extra) * (1 + 1e-12)
        assert published.simulation.peak_ram_bytes <= ram

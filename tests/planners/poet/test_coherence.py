"""A seed schedule made coherent (NOTE 29): reruns of paged-out tensors made page-ins where that saves energy, repeated
reruns held where RAM allows; never dearer than the seed but where it pages a consumer in at a stage over the budget
(NOTE 32), always a schedule the simulator runs, and on resnet50/jetsontx2 at its smallest footprint the rebuild
bound's settled point made one within 0.1% of its bound; on resnet50/m4 one that fits (NOTE 32)."""

from __future__ import annotations

import numpy as np
import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.planners.comparison import budget_ladder
from poetlab.planners.heuristics import minimal_recompute, stage_peaks
from poetlab.planners.poet.bounds import cover_schedules
from poetlab.planners.poet.coherence import coherent_schedule
from poetlab.planners.poet.milp import MilpOptions
from poetlab.planners.poet.rebuild_rounds import over_stages, point_schedule, worst_stages
from poetlab.planners.poet.rebuilds import rebuild_bound, tight_stages
from poetlab.planners.poet.repair import Budgets, repair_all
from poetlab.planners.poet.solver import solve

from small_graphs import convnet, residual, tiny_bert


def _instance(graph, platform, fraction):
    costs = CostModel.from_flops(graph, load_platform(platform))
    peak = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    footprint, _ = min_footprint_bytes(graph)
    return costs, MilpOptions(ram_budget_bytes=int(footprint + fraction * (peak - footprint)), runtime_budget_factor=1.5)


def _reruns_waiting_on_flash(graph, schedule) -> int:
    """Reruns of a tensor in a stage where it was paged out before and is paged in later (its copy waits on flash)."""
    m = schedule.matrices()
    T = graph.n_nodes
    count = 0
    for s, i in zip(*np.nonzero(m.R[:T])):
        outs, later = np.flatnonzero(m.M_OUT[:s, i]), np.flatnonzero(m.M_IN[s:T, i])
        count += int(i != s and outs.size > 0 and later.size > 0)
    return count


def _bytes_over(graph, schedule, options) -> float:
    """The bytes over the RAM budget, summed over the stages (the MILP's accounting)."""
    m = schedule.matrices()
    return float(np.clip(stage_peaks(graph, m.R, m.S_RAM) - options.ram_budget_bytes, 0, None).sum())


@pytest.mark.parametrize("graph", [residual, convnet, tiny_bert], ids=["residual", "convnet", "tiny_bert"])
@pytest.mark.parametrize("platform", ["m4", "m0", "jetsontx2"])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.3])
def test_the_coherent_schedule_runs_and_is_never_dearer_than_its_seed(graph, platform, fraction):
    """Seeds: the eviction cover's choices evicted over each tensor's longest idle interval (the covers' schedules, whose
    reruns read tensors still on flash) and the rebuild bound's point followed interval by interval, settled."""
    graph = graph()
    costs, options = _instance(graph, platform, fraction)
    seeds = cover_schedules(graph, costs, options)
    rebuilt = rebuild_bound(graph, costs, options)
    seeds += [schedule for schedule in [point_schedule(graph, rebuilt, settled=True)] if schedule is not None]
    for seed in seeds:
        made = coherent_schedule(graph, costs, seed, options.ram_budget_bytes)
        before, after = simulate(seed, graph, costs), simulate(made, graph, costs)
        # (dearer only where a consumer is paged in at a stage over the budget, NOTE 32: then less RAM is over it)
        assert after.energy_j <= before.energy_j * (1 + 1e-12) or _bytes_over(graph, made, options) < _bytes_over(graph, seed, options)
        assert _reruns_waiting_on_flash(graph, made) <= _reruns_waiting_on_flash(graph, seed)


def test_a_rerun_of_a_paged_out_tensor_becomes_a_page_in_where_that_is_cheaper():
    """On a chain of ReLUs with node 2 paged out after node 3 reads it and node 3 dropped, both read again at the end:
    the matrices' fewest recomputations rerun node 2 (and its inputs) to rebuild 3 before 2's page-in lands; coherent,
    2 is paged in a stage earlier and nothing below it is rerun."""
    from small_graphs import relu_chain

    graph = relu_chain(6)
    costs = CostModel.from_flops(graph, load_platform("jetsontx2"))
    T = graph.n_nodes
    schedule = checkpoint_all_schedule(graph)
    m = schedule.matrices()
    S_RAM, S_SSD, M_IN, M_OUT = (np.array(x[:T], dtype=bool) for x in (m.S_RAM, m.S_SSD, m.M_IN, m.M_OUT))
    uses = [sorted(set(users)) for users in graph.consumers]
    a, b = 2, 3  # (b reads a; each read again late in the backward pass)
    late_a = [u for u in uses[a] if u > b + 1]
    late_b = [u for u in uses[b] if u > b + 1]
    assert late_a and late_b and late_b[0] < late_a[0]
    S_RAM[b + 2 : late_a[0], a] = False
    M_OUT[b + 1, a] = M_IN[late_a[0] - 1, a] = True
    S_SSD[b + 2 : late_a[0], a] = True
    S_RAM[b + 2 : late_b[0] + 1, b] = False
    seed = type(schedule).from_matrices(graph, minimal_recompute(graph, S_RAM, M_IN), S_RAM, S_SSD, M_IN, M_OUT)
    made = coherent_schedule(graph, costs, seed, float("inf"))
    assert _reruns_waiting_on_flash(graph, seed) > 0 and _reruns_waiting_on_flash(graph, made) == 0
    assert simulate(made, graph, costs).energy_j < simulate(seed, graph, costs).energy_j


def test_resnet50_at_its_smallest_footprint_the_settled_point_is_near_its_bound():
    """Fig. 3's resnet50/jetsontx2/0/2x: the point of the rebuild bound at the tight stages followed interval by interval
    was over RAM at 168 stages and cost 1.09 plain steps (convolutions rerun for the batch-norms' rebuilds); settled
    and made coherent it is within 0.1% of the bound (1.003359 since NOTE 35), over RAM at fewer stages, and repaired
    with single changes (as `solve` does) a schedule within the budgets and within 0.1% of the bound."""
    graph = build_paper_graph("resnet50")
    costs = CostModel.from_flops(graph, load_platform("jetsontx2"))
    options = MilpOptions(ram_budget_bytes=budget_ladder(graph, costs, [0.0])[0], runtime_budget_factor=2.0)
    rebuilt = rebuild_bound(graph, costs, options, time_limit_s=10.0, stages=tight_stages)
    assert rebuilt.optimal
    plain = costs.plain_step_energy_j
    made = coherent_schedule(graph, costs, point_schedule(graph, rebuilt, settled=True), options.ram_budget_bytes)
    energy = simulate(made, graph, costs).energy_j
    assert rebuilt.bound_j <= energy <= rebuilt.bound_j * (1 + 1e-3)
    assert len(over_stages(graph, made, options.ram_budget_bytes)) < len(over_stages(graph, point_schedule(graph, rebuilt), options.ram_budget_bytes)) / 5
    assert energy < simulate(point_schedule(graph, rebuilt), graph, costs).energy_j - 0.05 * plain
    repaired = repair_all(graph, costs, [made], Budgets(float(options.ram_budget_bytes), 2.0 * costs.plain_step_runtime_s, 0), time_limit_s=10.0, chains=False)
    assert repaired
    fitting = simulate(repaired[0], graph, costs, ram_budget_bytes=options.ram_budget_bytes, runtime_budget_s=2.0 * costs.plain_step_runtime_s)
    assert rebuilt.bound_j <= fitting.energy_j <= rebuilt.bound_j * (1 + 1e-3)


@pytest.mark.slow
def test_solve_certifies_resnet50_at_its_smallest_footprint_on_the_tx2():
    """Fig. 3's resnet50/jetsontx2/0/2x, open before NOTE 29 (1.006231 at 60 s against 1.003302): certified without a
    MILP by the settled point, repaired."""
    graph = build_paper_graph("resnet50")
    costs = CostModel.from_flops(graph, load_platform("jetsontx2"))
    result = solve(graph, costs, budget_ladder(graph, costs, [0.0])[0], 2.0, mip_gap=1e-3, threads=1, time_limit_s=60.0)
    assert result.status == "optimal" and result.solver == "bound"
    assert result.energy_j / costs.plain_step_energy_j < 1.004307  # (what certifies against the rebuild bound's 1.003302)


def test_resnet50_m4_at_its_smallest_footprint_the_settled_point_of_the_worst_stages_bound_certifies():
    """Fig. 3's resnet50/m4/0/2x (NOTEs 32, 35): the tight stages' point settled is over RAM in the forward pass and
    the first backward layers; the bound again at those stages and the 4 stages its schedule is most over rises to
    1.103255 plain steps (1.099257 before NOTE 35's rows at consecutive stages), and that point settled, made coherent
    and repaired with single changes (as `solve` does) fits within 0.1% of it: the row's certificate."""
    graph = build_paper_graph("resnet50")
    costs = CostModel.from_flops(graph, load_platform("m4"))
    options = MilpOptions(ram_budget_bytes=budget_ladder(graph, costs, [0.0])[0], runtime_budget_factor=2.0)
    budget = float(options.ram_budget_bytes)
    tight = rebuild_bound(graph, costs, options, time_limit_s=20.0, stages=tight_stages)
    assert tight.optimal
    first = coherent_schedule(graph, costs, point_schedule(graph, tight, settled=True), budget)
    worst = worst_stages(graph, first, budget, 4)
    assert worst and min(worst) < tight.stages[0]
    again = rebuild_bound(graph, costs, options, time_limit_s=30.0, stages=sorted({*tight.stages, *worst}))
    assert again.optimal and again.bound_j > tight.bound_j
    made = coherent_schedule(graph, costs, point_schedule(graph, again, settled=True), budget)
    repaired = repair_all(graph, costs, [made], Budgets(budget, 2.0 * costs.plain_step_runtime_s, 0), time_limit_s=10.0, chains=False)
    assert repaired
    replayed = simulate(repaired[0], graph, costs, ram_budget_bytes=budget, runtime_budget_s=2.0 * costs.plain_step_runtime_s)
    assert again.bound_j <= replayed.energy_j <= again.bound_j * (1 + 1e-3)
"""The MILP formulation against the simulator: a schedule the simulator accepts, encoded as a solution
vector, satisfies every row of the MILP, and its objective is the simulated energy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.graph import min_footprint_bytes
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.planners.heuristics import greedy_remat_schedule
from poetlab.planners.poet.milp import MilpOptions, build_milp

from milp_checks import feasible
from small_graphs import residual
from solve_checks import setup as _setup


def test_checkpoint_all_is_feasible_for_the_milp_exactly_at_its_peak():
    graph = residual()
    costs = CostModel.from_flops(graph, load_platform("a72"))
    schedule = checkpoint_all_schedule(graph)
    peak = simulate(schedule, graph, costs).peak_ram_bytes
    at_peak = build_milp(graph, costs, MilpOptions(ram_budget_bytes=peak, paging=False))
    x = at_peak.encode(schedule.matrices().as_dict())
    assert feasible(at_peak, x)[0]
    below = build_milp(graph, costs, MilpOptions(ram_budget_bytes=peak - 1, paging=False))
    assert not feasible(below, below.encode(schedule.matrices().as_dict()))[0]


def test_reruns_priced_apart_cost_the_same_in_the_milp_as_in_the_simulator():
    """A cost model whose reruns cost more than first computes (a profiled host's): the simulator charges
    each recompute its rerun price, and the MILP's objective and runtime row charge the same."""
    graph = build_paper_graph("resnet18_cifar")
    flops = CostModel.from_flops(graph, load_platform("a72"))
    costs = dataclasses.replace(flops, recompute_runtime_s=1.7 * flops.runtime_s, recompute_energy_j=1.7 * flops.compute_energy_j)
    assert np.array_equal(flops.recompute_runtime_s, flops.runtime_s)  # (left out: a rerun costs a compute)
    budget = int(0.6 * simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes)
    schedule = greedy_remat_schedule(graph, costs, budget, 3.0 * costs.plain_step_runtime_s)
    sim, at_flops = simulate(schedule, graph, costs), simulate(schedule, graph, flops)
    reruns = schedule.recomputed_nodes()
    assert reruns and sim.n_recomputes == schedule.n_recomputes == len(reruns)
    assert sim.energy_j == pytest.approx(at_flops.energy_j + 0.7 * flops.compute_energy_j[reruns].sum(), rel=1e-12)
    assert sim.runtime_s == pytest.approx(at_flops.runtime_s + 0.7 * flops.runtime_s[reruns].sum(), rel=1e-12)
    R = schedule.matrices().R[: graph.n_nodes]
    assert costs.computes_runtime_s(R) == pytest.approx(sim.runtime_s, rel=1e-12)
    factor = sim.runtime_s / costs.plain_step_runtime_s
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=factor * (1 + 1e-9), paging=False))
    x = model.encode(schedule.matrices().as_dict())
    assert feasible(model, x)[0]
    assert model.c @ x == pytest.approx(sim.energy_j, rel=1e-9)
    # the runtime row charges the reruns at their price: a little less time refuses the schedule, which
    # fits at the first computes' price
    below = MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=factor * (1 - 1e-3), paging=False)
    assert not feasible(build_milp(graph, costs, below), x)[0]
    assert feasible(build_milp(graph, flops, below), x)[0]


@pytest.mark.parametrize("model_name,platform,budget,factor", [("linear", "m4", 3800, 1.2), ("linear", "a72", 3300, 1.05), ("residual", "m0", 0.7, 1.5)])
def test_faithful_mode_has_the_release_formulations_optimum(model_name, platform, budget, factor):
    """Faithful mode and the release's MILP transcribed row by row (tests/release_milp.py: duplicate edge,
    rows past each stage, wider big-M) certify the same optimum at a gap of 1e-6."""
    from poetlab.planners.poet.backends import run_milp

    from release_milp import solve_release_milp

    graph = residual() if model_name == "residual" else build_paper_graph(model_name)
    costs = CostModel.from_flops(graph, load_platform(platform))
    if budget < 1:
        budget = max(min_footprint_bytes(graph)[0], int(budget * simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes))
    status, release, release_bound = solve_release_milp(graph, costs, budget, factor, mip_gap=1e-6)
    ours = run_milp(build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget, runtime_budget_factor=factor)), solver="highs", mip_gap=1e-6, threads=1)
    assert status == "Optimal" and ours.status == "optimal"
    assert release > costs.plain_step_energy_j * (1 + 1e-6)  # the budget binds
    assert ours.objective == pytest.approx(release, rel=1e-6)


def _with_workspace(graph, workspace):
    """``graph`` with a measured workspace per node (as ``poetlab.torch.trace`` records it)."""
    from poetlab.core.graph import TrainingGraph

    by_name = {node.name: int(w) for node, w in zip(graph.nodes, workspace, strict=True)}
    return TrainingGraph(graph.name, graph.nodes, dict(graph.metadata, workspace_by_node=by_name))


def test_each_nodes_workspace_counts_while_it_runs_in_the_milp_as_in_the_simulator():
    """Per-operation workspace: the simulator counts node i's workspace beside what is live while i computes,
    and the MILP's memory rows do the same (U[t, k] holds R[t, k] w_k), so checkpoint-all fits exactly at its
    simulated peak, not a byte below; a solved schedule replays inside the budget; and the workspace of a
    node moves the peak only where that node runs."""
    plain = residual()
    costs = CostModel.from_flops(plain, load_platform("a72"))
    rng = np.random.default_rng(0)
    workspace = rng.integers(0, 2 * int(plain.output_bytes.max()), plain.n_nodes)
    graph = _with_workspace(plain, workspace)
    schedule = checkpoint_all_schedule(graph)
    sim, tensors = simulate(schedule, graph, costs), simulate(schedule, plain, costs)
    computes = [k for k, op in enumerate(schedule.ops) if op.kind.value == "compute"]
    assert np.array_equal(sim.memory_trace_bytes[computes] - tensors.memory_trace_bytes[computes], workspace[[schedule.ops[k].node for k in computes]])
    assert sim.peak_ram_bytes > tensors.peak_ram_bytes
    at_peak = build_milp(graph, costs, MilpOptions(ram_budget_bytes=sim.peak_ram_bytes, paging=False))
    assert feasible(at_peak, at_peak.encode(schedule.matrices().as_dict()))[0]
    below = build_milp(graph, costs, MilpOptions(ram_budget_bytes=sim.peak_ram_bytes - 1, paging=False))
    assert not feasible(below, below.encode(schedule.matrices().as_dict()))[0]
    footprint, _ = min_footprint_bytes(graph)
    budget = int(footprint + 0.3 * (sim.peak_ram_bytes - footprint))
    from poetlab import solve

    solved = solve(graph, costs, budget, time_limit_s=30)
    assert solved.schedule is not None and solved.status == "optimal"
    assert simulate(solved.schedule, graph, costs, ram_budget_bytes=budget).peak_ram_bytes <= budget
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget))
    assert feasible(model, model.encode(solved.schedule.matrices().as_dict()))[0]
    # the paper's graphs (no workspace) get the very same matrix as before
    assert (build_milp(plain, costs, MilpOptions(ram_budget_bytes=budget)).A != build_milp(_with_workspace(plain, 0 * workspace), costs, MilpOptions(ram_budget_bytes=budget)).A).nnz == 0


def test_milp_is_sparse_and_sized_by_lower_triangles():
    graph, costs, peak = _setup("resnet18_cifar", "a72")
    T, E = graph.n_nodes, graph.n_unique_edges
    full = build_milp(graph, costs, MilpOptions(ram_budget_bytes=peak / 2, runtime_budget_factor=2.0))
    no_paging = build_milp(graph, costs, MilpOptions(ram_budget_bytes=peak / 2, paging=False))
    tri, strict = T * (T + 1) // 2, T * (T - 1) // 2
    assert full.n_cols < 2 * tri + 4 * strict + T * E
    assert no_paging.n_cols < full.n_cols - 3 * strict + 1
    assert full.A.nnz < 12 * full.n_rows


@pytest.mark.parametrize("lower", ["a third", "below 0"])
def test_a_backward_nodes_workspace_left_alone_counts_in_the_milp_as_in_the_simulator(lower):
    """A backward node's lower workspace where the schedule leaves its forward node alone
    (``TrainingGraph.workspace_left_alone``, ``poetlab.core.schedule.left_alone_owners``; below 0 where its peak
    comes after its saved tensors made room): the simulator counts the lower one for checkpoint-all and the
    full one for a node a schedule recomputes or pages or whose reader it reruns, and the MILP's memory rows
    (MANAGED_f, at least each rerun and page-out of f and each rerun of a reader of it) agree with it to the
    byte on each schedule: feasible at its simulated peak, infeasible a byte below; a solved schedule replays
    inside its budget."""
    from poetlab.core.graph import TrainingGraph
    from poetlab.core.schedule import OpKind, left_alone_owners, managed_nodes
    from poetlab.planners.heuristics import greedy_paging_schedule

    plain = residual()
    costs = CostModel.from_flops(plain, load_platform("a72"))
    forward = [i for i, n in enumerate(plain.nodes) if not n.is_backward and plain.consumers[i]][1:]
    backward = [i for i, n in enumerate(plain.nodes) if n.is_backward]
    pairs = list(zip(backward, reversed(forward)))  # (any pairing: the forward node's treatment picks the figure)
    workspace = np.zeros(plain.n_nodes, dtype=np.int64)
    workspace[[b for b, _ in pairs]] = 3 * int(plain.output_bytes.max())
    metadata = dict(
        plain.metadata,
        workspace_by_node={n.name: int(w) for n, w in zip(plain.nodes, workspace, strict=True)},
        workspace_left_alone_by_node={
            plain.nodes[b].name: int(workspace[b]) // 3 if lower == "a third" else -int(plain.output_bytes[f]) // 2 for b, f in pairs
        },
        backward_of={plain.nodes[b].name: plain.nodes[f].name for b, f in pairs},
    )
    graph = TrainingGraph(plain.name, plain.nodes, metadata)
    assert np.array_equal(graph.workspace_owner[[b for b, _ in pairs]], [f for _, f in pairs])
    full_ws = _with_workspace(plain, workspace)
    everything = checkpoint_all_schedule(graph)
    assert not managed_nodes(graph, everything)
    assert simulate(everything, graph, costs).peak_ram_bytes < simulate(everything, full_ws, costs).peak_ram_bytes
    peak = simulate(everything, graph, costs).peak_ram_bytes
    schedules = [everything, greedy_remat_schedule(graph, costs, 0.7 * peak), greedy_paging_schedule(graph, costs, 0.7 * peak)]
    assert all(managed_nodes(graph, s) for s in schedules[1:])
    kept_by_a_reader = False  # (a node left alone whose reader a schedule reruns: the full figure)
    for schedule in schedules:
        sim = simulate(schedule, graph, costs)
        managed = managed_nodes(graph, schedule)
        alone = left_alone_owners(graph, schedule, managed)
        kept_by_a_reader |= bool(set(graph.workspace_readers) - managed - alone)
        computes = [k for k, op in enumerate(schedule.ops) if op.kind is OpKind.COMPUTE and graph.workspace_owner[op.node] >= 0]
        for k in computes:  # (the figure the forward node's treatment picks, beside the tensors)
            b = schedule.ops[k].node
            picked = graph.workspace_left_alone[b] if graph.workspace_owner[b] in alone else graph.workspace[b]
            assert sim.memory_trace_bytes[k] - simulate(schedule, plain, costs).memory_trace_bytes[k] == picked
        paging = schedule.count(OpKind.PAGE_OUT) > 0
        at_peak = build_milp(graph, costs, MilpOptions(ram_budget_bytes=sim.peak_ram_bytes, paging=paging))
        assert feasible(at_peak, at_peak.encode(schedule.matrices().as_dict()))[0]
        below = build_milp(graph, costs, MilpOptions(ram_budget_bytes=sim.peak_ram_bytes - 1, paging=paging))
        assert not feasible(below, below.encode(schedule.matrices().as_dict()))[0]
    from poetlab import solve

    assert kept_by_a_reader or lower == "below 0"  # (the greedy schedules there differ)
    # (a budget greedy schedules fit; where the lower figure is below 0, checkpoint-all's is lower still)
    budget = min(max(simulate(s, graph, costs).peak_ram_bytes for s in schedules[1:]), peak)
    assert budget < peak or lower == "below 0"
    solved = solve(graph, costs, budget, time_limit_s=30)
    assert solved.schedule is not None, solved
    assert simulate(solved.schedule, graph, costs, ram_budget_bytes=budget).peak_ram_bytes <= budget
    model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget))
    assert feasible(model, model.encode(solved.schedule.matrices().as_dict()))[0]


@pytest.mark.parametrize("name", ["reused", "mha"])
def test_an_output_let_go_before_its_saved_tensors_counts_in_the_milp_as_in_the_simulator(name):
    """A traced dropout's, LayerNorm's or attention's output goes after its last tensor reader where the schedule
    leaves the node alone, and its saved tensors stay to its backward (``TrainingGraph.early_release``,
    ``poetlab.core.schedule.released_nodes``): the MILP's memory rows (KEPT_f, at least each rerun, page-out and
    compress of f and each rerun of a reader of its output) agree with the simulator to the byte on
    checkpoint-all, a remat and a paging schedule: feasible at the simulated peak, infeasible a byte below; a
    solved schedule replays inside its budget."""
    import torch  # noqa: F401  (a traced model of examples/)

    from poetlab.core.schedule import OpKind, released_nodes
    from poetlab.planners.heuristics import greedy_paging_schedule
    from poetlab.torch.trace import trace
    from poetlab.torch.user_models import load_user_model
    from repo_paths import REPO

    model = load_user_model(f"{REPO}/examples/{name}.py:make")
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets)
    costs = CostModel.from_flops(graph, load_platform("a72"))
    everything = checkpoint_all_schedule(graph)
    peak = simulate(everything, graph, costs).peak_ram_bytes
    greedy = [make(graph, costs, f * peak) for make in (greedy_remat_schedule, greedy_paging_schedule) for f in (0.9, 0.8, 0.7)]
    schedules = [everything, *(s for s in greedy if s is not None)]
    assert graph.early_release and released_nodes(graph, everything) == set(graph.early_release)
    assert any(released_nodes(graph, s) < set(graph.early_release) for s in schedules[1:])
    assert any(s.count(OpKind.PAGE_OUT) for s in schedules) and any(s.n_recomputes for s in schedules)
    for schedule in schedules:
        sim = simulate(schedule, graph, costs)
        paging = schedule.count(OpKind.PAGE_OUT) > 0
        budget = sim.peak_ram_bytes + graph.reserved_bytes  # (build_milp keeps the reserved bytes free, as solve does)
        at_peak = build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget, paging=paging))
        assert feasible(at_peak, at_peak.encode(schedule.matrices().as_dict()))[0]
        below = build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget - 1, paging=paging))
        assert not feasible(below, below.encode(schedule.matrices().as_dict()))[0]
    if name == "reused":
        from poetlab import solve

        budget = int(min(simulate(s, graph, costs).peak_ram_bytes for s in schedules) + graph.reserved_bytes)
        solved = solve(graph, costs, budget, time_limit_s=30)
        assert solved.schedule is not None, solved
        assert simulate(solved.schedule, graph, costs, ram_budget_bytes=budget - graph.reserved_bytes).peak_ram_bytes <= budget - graph.reserved_bytes
        model = build_milp(graph, costs, MilpOptions(ram_budget_bytes=budget))
        assert feasible(model, model.encode(solved.schedule.matrices().as_dict()))[0]

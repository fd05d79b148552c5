"""The cost model: the paper's flop model from a platform's coefficients, reruns priced apart, and the
one-line refusals of costs that cannot be right."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from poetlab import CostModel, build_paper_graph, load_platform
from poetlab.core.costs import check_graph_and_costs, check_number
from poetlab.errors import InvalidArgumentError


def test_from_flops_is_the_papers_model():
    graph, platform = build_paper_graph("linear"), load_platform("a72")
    costs = CostModel.from_flops(graph, platform)
    assert costs.platform == "a72" and costs.n_nodes == graph.n_nodes
    assert np.allclose(costs.runtime_s, graph.flop / platform.flops_per_s)
    assert np.allclose(costs.compute_energy_j, graph.flop / platform.flop_per_j)
    pagein = platform.pagein_latency_s + graph.output_bytes / platform.pagein_throughput_bytes_per_s
    pageout = platform.pageout_latency_s + graph.output_bytes / platform.pageout_throughput_bytes_per_s
    assert np.allclose(costs.pagein_time_s, pagein) and np.allclose(costs.pageout_time_s, pageout)
    assert np.allclose(costs.pagein_energy_j, pagein * platform.memory_power_w)
    assert costs.plain_step_runtime_s == pytest.approx(costs.runtime_s.sum())
    assert costs.plain_step_energy_j == pytest.approx(costs.compute_energy_j.sum())
    # the flop model prices a rerun as a first compute
    assert np.array_equal(costs.recompute_runtime_s, costs.runtime_s) and np.array_equal(costs.recompute_energy_j, costs.compute_energy_j)


def test_cost_arrays_are_read_only():
    costs = CostModel.from_flops(build_paper_graph("linear"), load_platform("m0"))
    with pytest.raises(ValueError):
        costs.runtime_s[0] = 1.0


def test_a_rerun_is_priced_apart_from_the_first_compute():
    """The diagonal of R (a node in its own stage) is its first compute, any other entry a rerun."""
    costs = CostModel("p", [1.0, 2.0], [1.0, 1.0], [0, 0], [0, 0], [0, 0], [0, 0], recompute_runtime_s=[10.0, 20.0])
    R = np.array([[True, False], [True, True]])  # node 0 in stage 0, node 0 again and node 1 in stage 1
    assert costs.computes_runtime_s(R) == pytest.approx(1.0 + 10.0 + 2.0)
    assert CostModel("p", [1.0, 2.0], [1.0, 1.0], [0, 0], [0, 0], [0, 0], [0, 0]).computes_runtime_s(R) == pytest.approx(1.0 + 1.0 + 2.0)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"runtime_s": [1.0, -1.0]}, "runtime_s must be one-dimensional, finite and non-negative"),
        ({"pagein_time_s": [1.0, float("nan")]}, "pagein_time_s must be one-dimensional, finite"),
        ({"compute_energy_j": "cheap"}, "compute_energy_j must be a sequence of numbers"),
        ({"pageout_time_s": [1.0]}, "one entry per node"),
        ({"platform": 3}, "platform must be a platform name"),
        ({"compression": "zip"}, "compression must be CompressionCosts or None"),
    ],
)
def test_costs_that_cannot_be_right_are_refused_in_one_line(change, message):
    arrays = dict(runtime_s=[1.0, 2.0], compute_energy_j=[1.0, 2.0], pagein_time_s=[0.1, 0.1], pageout_time_s=[0.1, 0.1],
                  pagein_energy_j=[0.1, 0.1], pageout_energy_j=[0.1, 0.1])
    arguments = {"platform": "p", **arrays, **change}
    with pytest.raises(InvalidArgumentError, match=message) as info:
        CostModel(**arguments)
    assert "\n" not in str(info.value)


def test_costs_of_another_graph_are_named_as_such():
    linear, resnet = build_paper_graph("linear"), build_paper_graph("resnet18_cifar")
    costs = CostModel.from_flops(linear, load_platform("m0"))
    check_graph_and_costs("solve", linear, costs)  # the same graph: accepted
    with pytest.raises(InvalidArgumentError, match=rf"solve: the costs have {linear.n_nodes} nodes but graph 'resnet18_cifar' has {resnet.n_nodes}"):
        check_graph_and_costs("solve", resnet, costs)
    with pytest.raises(InvalidArgumentError, match="solve: costs must be a CostModel, got dict"):
        check_graph_and_costs("solve", linear, {})
    with pytest.raises(InvalidArgumentError, match="from_flops: platform must be a Platform"):
        CostModel.from_flops(linear, "m0")


def test_check_number_takes_finite_real_numbers_in_range():
    check_number("f", "x", 0.5, 0, 1)
    check_number("f", "x", np.int64(3), 1)
    check_number("f", "x", None, 0, optional=True)
    for bad in (True, float("inf"), float("nan"), -1, 2, "1", None):
        with pytest.raises(InvalidArgumentError, match=r"^f: x must be a finite number from 0 to 1"):
            check_number("f", "x", bad, 0, 1)


def test_with_compression_keeps_every_other_cost():
    costs = CostModel.from_flops(build_paper_graph("linear"), load_platform("m0"))
    plain = costs.with_compression(None)
    assert plain.compression is None and np.array_equal(plain.runtime_s, costs.runtime_s)
    assert dataclasses.replace(plain, platform="x").platform == "x"

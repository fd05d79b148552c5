"""The paging costs of each platform, and the batch at which training needs 50x inference's memory."""

from __future__ import annotations

from poetlab.core.paper_models import build_paper_graph
from poetlab.reproduction.feasibility import inference_peak_bytes, memory_ratio_table


def test_paging_costs_and_the_batch_at_which_training_needs_200x():
    from poetlab.reproduction.cost_facts import paging_cost_table
    from poetlab.reproduction.feasibility import crossing_batch

    costs = paging_cost_table("resnet18_cifar", ("m4", "a72")).set_index("platform")
    assert costs.page_vs_forward_compute["m4"] > 100 * costs.page_vs_forward_compute["a72"]  # the M4 computes cheaply, pages dearly
    assert 0 < costs.page_all_overhead["a72"] < costs.page_all_overhead["m4"]
    batch = crossing_batch("resnet18_cifar", ratio=50)
    inference = inference_peak_bytes(build_paper_graph("resnet18_cifar", 1))
    train = {b: int(memory_ratio_table(["resnet18_cifar"], b).train_peak_bytes.iloc[0]) for b in (batch - 1, batch)}
    assert train[batch] > 50 * inference >= train[batch - 1]
    assert crossing_batch("bert") is None  # one sequence, no batch dimension

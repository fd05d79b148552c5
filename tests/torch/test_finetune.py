"""Training under a schedule: identical loss curves on the digits data set, and the ``execute`` command."""

from __future__ import annotations


import pytest
import torch
from torch import nn

import poetlab
from poetlab.torch.finetune import DigitsCNN, compare_training, digits_batches
from poetlab.planners.heuristics import greedy_paging_schedule, greedy_remat_schedule
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.torch.trace import trace


pytestmark = pytest.mark.usefixtures("deterministic_torch")


@pytest.mark.parametrize("planner", [greedy_remat_schedule, greedy_paging_schedule])
def test_digits_training_under_a_schedule_has_the_plain_loss_curve(planner):
    torch.manual_seed(0)
    module = DigitsCNN(width=4, depth=3)
    batches = digits_batches(16, 6)
    loss_fn = nn.CrossEntropyLoss()
    graph = trace(module, batches[0][0], loss_fn, batches[0][1])
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    schedule = planner(graph, costs, 0.6 * simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes)
    assert schedule is not None
    before = {k: v.clone() for k, v in module.state_dict().items()}
    run = compare_training(module, graph, schedule, loss_fn, batches, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    assert run.identical
    assert run.plain_losses == run.scheduled_losses and len(run.plain_losses) == 6
    assert run.n_recomputes + run.n_pageouts > 0
    assert all(peak > 0 for peak in run.scheduled_peak_bytes)
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())  # the caller's model is untouched


def test_digits_batches_are_the_packaged_data_set():
    batches = digits_batches(32, 60, seed=3)
    assert len(batches) == 60 and batches[0][0].shape == (32, 1, 8, 8)
    assert float(batches[0][0].max()) <= 1.0 and set(torch.cat([y for _, y in batches]).tolist()) == set(range(10))

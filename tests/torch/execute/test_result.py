"""What an executed step returns: its counts, bytes and times beside the simulator's prediction for the same
schedule, as a flat row; and the error a step raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from poetlab import CostModel, load_platform
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.errors import PoetlabError
from poetlab.planners.heuristics import greedy_paging_schedule
from poetlab.torch.execute import execute
from poetlab.torch.execute.result import ExecutionError, ExecutionResult
from poetlab.torch.models import ConvChain
from poetlab.torch.trace import trace

from execute_cases import full_peak, traced


def _case():
    torch.manual_seed(0)
    module, x, y = ConvChain(4, 8, 3, 4), torch.randn(2, 4, 8, 8), torch.randint(4, (2,))
    graph = trace(module, x, nn.CrossEntropyLoss(), y, name="chain")
    return module, x, y, graph, CostModel.from_flops(graph, load_platform("a72"))


def test_a_step_reports_what_it_did_beside_the_prediction(tmp_path):
    module, x, y, graph, costs = traced("resnet", True)
    schedule = greedy_paging_schedule(graph, costs, 0.6 * full_peak(graph, costs))
    assert schedule is not None
    predicted = simulate(schedule, graph, costs)
    result = execute(module, schedule, (x, y), graph=graph, loss_fn=nn.CrossEntropyLoss(), costs=costs, paging_dir=tmp_path)
    assert isinstance(result, ExecutionResult)
    assert (result.predicted.peak_ram_bytes, result.predicted.energy_j) == (predicted.peak_ram_bytes, predicted.energy_j)
    assert (result.n_pageouts, result.n_pageins, result.n_recomputes) == (predicted.n_pageouts, predicted.n_pageins, predicted.n_recomputes) and result.n_pageouts > 0
    assert result.bytes_written == result.bytes_read > 0 and result.n_unplanned == 0
    assert result.runtime_s == pytest.approx(result.cpu_s - result.paging_cpu_s + result.paging_wall_s)
    row = result.to_dict()
    assert row["runtime_s"] == result.runtime_s and row["predicted_peak_bytes"] == predicted.peak_ram_bytes
    assert row["predicted_paging_time_s"] == predicted.paging_time_s and row["n_pageouts"] == result.n_pageouts
    assert all(not isinstance(value, (list, dict)) for value in row.values())  # a flat row, for a table


def test_without_costs_there_is_no_prediction_in_the_row():
    module, x, y, graph, _ = _case()
    result = execute(module, checkpoint_all_schedule(graph), (x, y), graph=graph, loss_fn=nn.CrossEntropyLoss(), measure_memory=False)
    assert result.predicted is None and result.peak_bytes is None and result.total_peak_bytes is None
    assert not any(key.startswith("predicted_") for key in result.to_dict())


def test_the_error_is_one_a_caller_catches_as_a_poetlab_error():
    assert issubclass(ExecutionError, PoetlabError) and issubclass(ExecutionError, RuntimeError)

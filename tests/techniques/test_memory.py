"""Peak memory of a piece of PyTorch work from the CPU allocator's events, whole and by phase; bytes of
distinct storages."""

from __future__ import annotations

import torch
from torch import nn

from poetlab.techniques.memory import measure_peak_bytes, parameter_bytes, phase, tensor_bytes


def test_the_peak_and_what_is_left_are_the_allocators():
    kept = []

    def work():
        a = torch.empty(250_000)  # 1 MB, freed
        b = torch.empty(500_000)  # 2 MB, kept
        del a
        with phase("burst"):
            c = torch.empty(1_000_000)  # 4 MB on top of b
            del c
        with phase("small"):
            d = torch.empty(25_000)  # 100 kB on top of b
            del d
        kept.append(b)

    measured = measure_peak_bytes(work)
    assert measured.peak_bytes == 2_000_000 + 4_000_000  # b and c at once (a was freed before c)
    assert measured.net_bytes == 2_000_000 and measured.n_events == 7
    assert measured.phase_peak("burst") == 6_000_000
    assert measured.phase_peak("small") == 2_100_000  # the running sum includes what earlier parts left
    assert measured.phase_peak("never") == 0


def test_what_existed_before_the_work_is_not_counted():
    existing = torch.empty(1_000_000)
    measured = measure_peak_bytes(existing.zero_)  # in place: no new storage
    assert measured.peak_bytes == 0 and measured.net_bytes == 0


def test_storages_shared_by_views_count_once():
    x, y = torch.zeros(100), torch.zeros(10, dtype=torch.float64)
    assert tensor_bytes([x, x[10:], x.view(10, 10), y]) == 400 + 80
    module = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    module[0].requires_grad_(False)
    assert parameter_bytes(module) == (4 * 3 + 3 + 3 * 2 + 2) * 4
    assert parameter_bytes(module, trainable_only=True) == (3 * 2 + 2) * 4

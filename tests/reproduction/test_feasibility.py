"""Which models fit which platforms, and how much more memory training needs than inference."""

from __future__ import annotations

import pytest

from poetlab.core.paper_models import build_paper_graph
from poetlab.core.platforms import load_platform
from poetlab.reproduction.feasibility import feasibility_table, inference_peak_bytes, memory_ratio_table


def test_feasibility_and_memory_ratio():
    linear = build_paper_graph("linear")
    assert inference_peak_bytes(linear) == 3176  # 784 inputs and the first 10-wide layer's output, 4 bytes each, and the rest freed
    ratio = memory_ratio_table(["linear"]).iloc[0]
    assert ratio.train_peak_bytes == 7416 and ratio.train_vs_inference == pytest.approx(7416 / 3176)
    table = feasibility_table(["linear", "resnet18_cifar"], [load_platform("m0"), load_platform("m4")])
    assert table.verified_by_schedule.all()
    fits = {(r.model, r.platform): r.fits_device_ram for r in table.itertuples()}
    assert fits == {("linear", "m0"): True, ("linear", "m4"): True, ("resnet18_cifar", "m0"): False, ("resnet18_cifar", "m4"): True}

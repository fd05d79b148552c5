from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture
def run_cli():
    """Run the real ``poetlab`` command in a subprocess; returns the CompletedProcess."""

    def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "poetlab", *args], capture_output=True, text=True, cwd=cwd, timeout=300
        )

    return run


@pytest.fixture
def deterministic_torch():
    """``torch.use_deterministic_algorithms(True)`` and the executor's kernels for one test (bitwise gradient
    comparisons: a plain step and an executed one agree bit for bit only on the same kernels; NOTE
    [kernel choice] in poetlab.torch.kernels)."""
    import torch

    from poetlab.torch.kernels import planned_kernels

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    with planned_kernels():
        yield
    torch.use_deterministic_algorithms(previous)

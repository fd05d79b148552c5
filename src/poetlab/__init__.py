"""poetlab: a reproduction kit for POET (Patil et al., ICML 2022) and its neighbours.

The flow: a :class:`Platform` (or a measured :class:`HostProfile`) and a :class:`TrainingGraph` (a paper
layer list, or :func:`trace` of an ``nn.Module``) give a :class:`CostModel`; planners turn
those and budgets into schedules; a simulator checks and costs every schedule.
"""

from poetlab.core.costs import CostModel
from poetlab.core.graph import Node, TrainingGraph
from poetlab.core.paper_models import PAPER_MODELS, build_paper_graph
from poetlab.core.platforms import Platform, available_platforms, load_platform, load_platform_file
from poetlab.core.schedule import InvalidScheduleError, Op, OpKind, Schedule, SimulationResult, checkpoint_all_schedule, simulate
from poetlab.core.summary import GraphSummary, summarize_graph
from poetlab.errors import (
    GraphFileError,
    InvalidArgumentError,
    OutputError,
    PlatformSpecError,
    PoetlabError,
    ScheduleFileError,
    UnknownNameError,
)
from poetlab.planners.poet.solver import SolveResult, solve

__version__ = "0.1.0"

# Names that need torch are imported on first use (PEP 562), so that ``import poetlab`` stays light: the
# HiGHS worker process imports the package for every solve, and torch alone takes seconds to import
# (tests/test_layout.py checks it in a fresh interpreter).
_LAZY = {
    "ExecutionError": "poetlab.torch.execute",
    "ExecutionResult": "poetlab.torch.execute",
    "ScheduleExecutor": "poetlab.torch.execute",
    "execute": "poetlab.torch.execute",
    "TraceError": "poetlab.torch.trace",
    "trace": "poetlab.torch.trace",
    "trace_torch_model": "poetlab.torch.trace",
    "HostProfile": "poetlab.torch.host_profile",
    "host_costs": "poetlab.torch.host_profile",
    "PagingDirError": "poetlab.torch.profile",
    "ProfileFileError": "poetlab.torch.host_profile",
    "profile_host": "poetlab.torch.profile",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'poetlab' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value

__all__ = [
    "PAPER_MODELS",
    "CostModel",
    "ExecutionError",
    "ExecutionResult",
    "ScheduleExecutor",
    "GraphFileError",
    "ScheduleFileError",
    "GraphSummary",
    "HostProfile",
    "InvalidArgumentError",
    "InvalidScheduleError",
    "Op",
    "OpKind",
    "Schedule",
    "SimulationResult",
    "SolveResult",
    "TraceError",
    "Node",
    "OutputError",
    "PagingDirError",
    "Platform",
    "PlatformSpecError",
    "PoetlabError",
    "ProfileFileError",
    "TrainingGraph",
    "UnknownNameError",
    "available_platforms",
    "build_paper_graph",
    "checkpoint_all_schedule",
    "execute",
    "host_costs",
    "load_platform",
    "load_platform_file",
    "profile_host",
    "simulate",
    "solve",
    "summarize_graph",
    "trace",
    "trace_torch_model",
]

"""poetlab: a reproduction kit for POET (Patil et al., ICML 2022) and its neighbours.

The flow: a :class:`Platform` (or a measured :class:`HostProfile`) and a :class:`TrainingGraph` (a paper
layer list, or :func:`trace` of an ``nn.Module``) give a :class:`CostModel`; planners turn
those and budgets into schedules; a simulator checks and costs every schedule.
"""

import sys
import types

from poetlab.costs import CostModel
from poetlab.errors import (
    GraphFileError,
    InvalidArgumentError,
    OutputError,
    PlatformSpecError,
    PoetlabError,
    ScheduleFileError,
    UnknownNameError,
)
from poetlab.graph import Node, TrainingGraph
from poetlab.paper_models import PAPER_MODELS, build_paper_graph
from poetlab.platforms import Platform, available_platforms, load_platform, load_platform_file
from poetlab.poet_solver import SolveResult, solve
from poetlab.schedule import InvalidScheduleError, Op, OpKind, Schedule, SimulationResult, checkpoint_all_schedule, simulate
from poetlab.summary import GraphSummary, summarize_graph

__version__ = "0.1.0"

# Names that need torch are imported on first use (PEP 562), so that ``import poetlab`` stays light: the
# CLI and the solver start in well under a second, and torch alone takes seconds to import.
_LAZY = {
    "ExecutionError": "poetlab.execute",
    "ExecutionResult": "poetlab.execute",
    "ScheduleExecutor": "poetlab.execute",
    "execute": "poetlab.execute",
    "TraceError": "poetlab.trace",
    "trace": "poetlab.trace",
    "trace_torch_model": "poetlab.trace",
    "HostProfile": "poetlab.profile",
    "PagingDirError": "poetlab.profile",
    "ProfileFileError": "poetlab.profile",
    "profile_host": "poetlab.profile",
}


class _Package(types.ModuleType):
    """The package exports the function ``execute``, whose module has the same name: importing that
    module (finetune and profile do) must not replace the function by the module on the package."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "execute" and isinstance(value, types.ModuleType):
            value = value.execute
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


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
    "load_platform",
    "load_platform_file",
    "profile_host",
    "simulate",
    "solve",
    "summarize_graph",
    "trace",
    "trace_torch_model",
]

"""poetlab: a reproduction kit for POET (Patil et al., ICML 2022) and its neighbours.

The flow: a :class:`Platform` (or a measured :class:`HostProfile`) and a :class:`TrainingGraph` (a paper
layer list, or :func:`trace` of an ``nn.Module``) give a :class:`CostModel`; planners turn
those and budgets into schedules; a simulator checks and costs every schedule.
"""

from poetlab.costs import CostModel
from poetlab.errors import (
    GraphFileError,
    InvalidArgumentError,
    OutputError,
    PlatformSpecError,
    PoetlabError,
    UnknownNameError,
)
from poetlab.execute import ExecutionError, ExecutionResult, ScheduleExecutor, execute
from poetlab.graph import Node, TrainingGraph
from poetlab.paper_models import PAPER_MODELS, build_paper_graph
from poetlab.platforms import Platform, available_platforms, load_platform, load_platform_file
from poetlab.poet_solver import SolveResult, solve
from poetlab.profile import HostProfile, PagingDirError, ProfileFileError, profile_host
from poetlab.schedule import InvalidScheduleError, Op, OpKind, Schedule, SimulationResult, checkpoint_all_schedule, simulate
from poetlab.summary import GraphSummary, summarize_graph
from poetlab.trace import TraceError, trace, trace_torch_model

__version__ = "0.1.0"

__all__ = [
    "PAPER_MODELS",
    "CostModel",
    "ExecutionError",
    "ExecutionResult",
    "ScheduleExecutor",
    "GraphFileError",
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

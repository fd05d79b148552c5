"""Helpers the commands share: the one-line parser, argument types, the graph and costs of a model on a platform."""

from __future__ import annotations

import argparse
import logging
import math

from poetlab.core.costs import CostModel
from poetlab.errors import InvalidArgumentError, UnknownNameError
from poetlab.core.graph import TrainingGraph
from poetlab.core.paper_models import PAPER_MODELS, build_paper_graph
from poetlab.core.platforms import HOST, load_platform



EXIT_USAGE = 2
EXIT_NO_SCHEDULE = 1  # `solve` found no schedule (infeasible, or nothing within the time limit)
log = logging.getLogger("poetlab")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


#: The largest number of bytes a budget flag takes (1 PiB): above any device's memory, and low enough that
#: the solvers' arithmetic stays exact.
MAX_BUDGET_BYTES = 2**50


def positive_int(text: str, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1 or (high is not None and value > high):
        raise argparse.ArgumentTypeError(f"expected a positive integer up to {high}, got {text!r}" if high else f"expected a positive integer, got {text!r}")
    return value


def batch_size(text: str) -> int:
    from poetlab.core.paper_models import MAX_BATCH_SIZE

    return positive_int(text, MAX_BATCH_SIZE)


def threads(text: str) -> int:
    """A thread count from 1 to this machine's CPUs (more only oversubscribes the cores, or hangs)."""
    import os

    return positive_int(text, os.cpu_count() or 1)


def budget_bytes(text: str) -> float:
    value = positive_float(text)
    if value > MAX_BUDGET_BYTES:
        raise argparse.ArgumentTypeError(f"expected a number of bytes from 1 to {MAX_BUDGET_BYTES} (1 PiB), got {text!r}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value




def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="paper model or torch model name (see `poetlab models`), or your own: path/to/file.py:FUNCTION")
    parser.add_argument("--platform", required=True, help="platform name (see `poetlab platforms`), `host`, or a platform YAML file")
    parser.add_argument("--platform-dir", default=None, help="directory of platform YAML files (default: the paper's devices built into poetlab)")
    parser.add_argument("--batch-size", type=batch_size, default=1, help="batch size (default 1; a model file's batch is its own)")
    parser.add_argument("--fuse", action="store_true", help="torch models: fuse cheap element-wise nodes into their producers")
    parser.add_argument("--profile", default=None, metavar="FILE", help="host profile JSON (default: data/profiles/host-MODEL.json, else any host profile there)")


def model_graph(model: str, batch_size: int, fuse: bool) -> TrainingGraph:
    """A paper model's layer-list graph, or a torch model's traced graph (torch imported only then)."""
    if model in PAPER_MODELS:
        if fuse:
            raise InvalidArgumentError(f"--fuse applies to traced torch models; {model} is a paper model (try {model}_torch)")
        return build_paper_graph(model, batch_size)
    from poetlab.torch.models import TORCH_MODELS
    from poetlab.torch.user_models import is_user_model

    if model in TORCH_MODELS or is_user_model(model):
        from poetlab.torch.trace import trace_torch_model

        return trace_torch_model(model, batch_size, fuse=fuse)
    raise UnknownNameError("model", model, [*PAPER_MODELS, *TORCH_MODELS])


def host_profile(args: argparse.Namespace):
    """The host profile ``--platform host`` costs with (``--profile``, else the one found for the model),
    loaded and checked before any graph is traced, so a bad file is refused at once."""
    from poetlab.torch.host_profile import HostProfile, find_host_profile

    path = args.profile or find_host_profile(args.model, args.fuse)
    return path, HostProfile.load(path)


def host_costs(graph: TrainingGraph, args: argparse.Namespace, profile=None) -> CostModel:
    """Measured per-node costs when the profile timed this graph; else flops at the host's measured rate
    (:func:`poetlab.torch.host_profile.host_costs`, saying which). ``profile``: ``(path, HostProfile)``
    from :func:`host_profile`, loaded here when not given."""
    from poetlab.torch.host_profile import host_costs as costs_on_host

    path, loaded = profile or host_profile(args)
    costs, source = costs_on_host(graph, loaded)
    if source == "profiled":
        log.info("host costs: per-node times measured in %s", path)
    else:
        log.warning("%s has no per-node timings for this graph; costing it by %s", path, source)
    return costs


def graph_and_costs(args: argparse.Namespace) -> tuple[TrainingGraph, CostModel]:
    platform = None if args.platform == HOST else load_platform(args.platform, args.platform_dir)
    profile = host_profile(args) if platform is None else None
    graph = model_graph(args.model, args.batch_size, args.fuse)
    if platform is None:
        return graph, host_costs(graph, args, profile)
    return graph, CostModel.from_flops(graph, platform)




def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def fraction(text: str) -> float:
    value = positive_float(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got {text!r}")
    return value

"""Helpers the commands share: the one-line parser, argument types, the graph and costs of a model on a platform."""

from __future__ import annotations

import argparse
import logging

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


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value




def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="paper model or torch model name (see `poetlab models`)")
    parser.add_argument("--platform", required=True, help="platform name (see `poetlab platforms`), `host`, or a platform YAML file")
    parser.add_argument("--platform-dir", default=None, help="directory of platform YAML files (default: the checkout's data/platforms)")
    parser.add_argument("--batch-size", type=positive_int, default=1, help="batch size (default 1)")
    parser.add_argument("--fuse", action="store_true", help="torch models: fuse cheap element-wise nodes into their producers")
    parser.add_argument("--profile", default=None, metavar="FILE", help="host profile JSON (default: data/profiles/host-MODEL.json, else any host profile there)")


def model_graph(model: str, batch_size: int, fuse: bool) -> TrainingGraph:
    """A paper model's layer-list graph, or a torch model's traced graph (torch imported only then)."""
    if model in PAPER_MODELS:
        if fuse:
            raise InvalidArgumentError(f"--fuse applies to traced torch models; {model} is a paper model (try {model}_torch)")
        return build_paper_graph(model, batch_size)
    from poetlab.torch.models import TORCH_MODELS

    if model in TORCH_MODELS:
        from poetlab.torch.trace import trace_torch_model

        return trace_torch_model(model, batch_size, fuse=fuse)
    raise UnknownNameError("model", model, [*PAPER_MODELS, *TORCH_MODELS])


def host_costs(graph: TrainingGraph, args: argparse.Namespace) -> CostModel:
    """Measured per-node costs when the profile timed this graph; else flops at the host's measured rate."""
    from poetlab.torch.host_profile import HostProfile, find_host_profile

    path = args.profile or find_host_profile(args.model, args.fuse)
    profile = HostProfile.load(path)
    timed = profile.model
    if timed is not None and tuple(n.name for n in timed.nodes) == tuple(n.name for n in graph.nodes):
        log.info("host costs: per-node times measured in %s", path)
        return CostModel.from_profile(graph, profile)
    log.warning("%s has no per-node timings for this graph; costing it by flops at the host's measured %.3g flop/s", path, profile.flops_per_s)
    return CostModel.from_flops(graph, profile.platform())


def graph_and_costs(args: argparse.Namespace) -> tuple[TrainingGraph, CostModel]:
    platform = None if args.platform == HOST else load_platform(args.platform, args.platform_dir)
    graph = model_graph(args.model, args.batch_size, args.fuse)
    if platform is None:
        return graph, host_costs(graph, args)
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

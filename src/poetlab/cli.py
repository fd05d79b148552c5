"""The ``poetlab`` command: a thin shell over the package's functions.

Errors a person can fix (a :class:`~poetlab.errors.PoetlabError`) are printed as one line on stderr
and exit with code 2, as argparse does for bad flags.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from poetlab import __version__
from poetlab._io import write_text_atomic
from poetlab.costs import CostModel
from poetlab.errors import PoetlabError
from poetlab.paper_models import PAPER_MODELS, build_paper_graph
from poetlab.platforms import available_platforms, load_platform
from poetlab.summary import summarize_graph

EXIT_USAGE = 2
log = logging.getLogger("poetlab")


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage is one ``--help`` away)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_platform_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--platform", required=True, help="platform name (see `poetlab platforms`) or a platform YAML file")
    parser.add_argument("--platform-dir", default=None, help="directory of platform YAML files (default: the checkout's data/platforms)")


def _cmd_graph(args: argparse.Namespace) -> int:
    platform = load_platform(args.platform, args.platform_dir)
    graph = build_paper_graph(args.model, args.batch_size)
    summary = summarize_graph(graph, CostModel.from_flops(graph, platform))
    if args.output:
        write_text_atomic(args.output, graph.to_json())
        log.info("wrote the training graph to %s", args.output)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    rows = [
        ("model", f"{summary.model} (batch {summary.batch_size})"),
        ("platform", summary.platform),
        ("nodes", f"{summary.n_nodes} ({summary.n_forward} forward, {summary.n_backward} backward)"),
        ("edges", f"{summary.n_edges} ({summary.n_unique_edges} distinct)"),
        ("total runtime", f"{summary.total_runtime_s:.9g} s"),
        ("forward RAM", f"{summary.forward_ram_bytes:,} bytes"),
        ("largest tensor", f"{summary.peak_tensor_bytes:,} bytes"),
        ("plain-step energy", f"{summary.plain_step_energy_j:.12g} J"),
        ("parameters", f"{summary.param_bytes:,} bytes"),
    ]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    return 0


def _cmd_platforms(args: argparse.Namespace) -> int:
    for name in available_platforms(args.platform_dir):
        platform = load_platform(name, args.platform_dir)
        print(f"{name:<12} {platform.description}")
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    for name, spec in PAPER_MODELS.items():
        print(f"{name:<16} {spec.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="poetlab", description="POET: energy-optimal rematerialization and paging for on-device training")
    parser.add_argument("--version", action="version", version=f"poetlab {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and solver choices")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    graph = commands.add_parser("graph", help="summarise a model's training graph on a platform")
    graph.add_argument("--model", required=True, help="paper model name (see `poetlab models`)")
    _add_platform_args(graph)
    graph.add_argument("--batch-size", type=_positive_int, default=1, help="batch size (default 1)")
    graph.add_argument("--json", action="store_true", help="print one JSON object")
    graph.add_argument("--output", default=None, metavar="FILE", help="also write the training graph as JSON to FILE")
    graph.set_defaults(run=_cmd_graph)

    platforms = commands.add_parser("platforms", help="list the platforms")
    platforms.add_argument("--platform-dir", default=None, help="directory of platform YAML files")
    platforms.set_defaults(run=_cmd_platforms)

    models = commands.add_parser("models", help="list the paper models")
    models.set_defaults(run=_cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        return args.run(args)
    except PoetlabError as exc:
        print(f"poetlab: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("poetlab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

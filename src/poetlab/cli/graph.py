"""``poetlab graph``: a model's training graph on a platform, summarised."""

from __future__ import annotations

import argparse
import json

from poetlab.core.files import write_text_atomic
from poetlab.core.summary import summarize_graph

from poetlab.cli.common import graph_and_costs, log


def cmd_graph(args: argparse.Namespace) -> int:
    graph, costs = graph_and_costs(args)
    summary = summarize_graph(graph, costs)
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

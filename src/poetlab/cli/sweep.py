"""``poetlab sweep STAGE``: one reproduction stage's sweep outside DVC, on local processes or a Dask cluster,
for running a single figure where the cores are. Writes what the stage's notebook writes of it: the tidy
rows (``DIR/results/STAGE.{csv,md}``) and the stage's metrics (``DIR/metrics/STAGE.json``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from poetlab.core.files import write_json_atomic
from poetlab.errors import InvalidArgumentError
from poetlab.reproduction.config import stage_config
from poetlab.reproduction.sweep import cluster_address, comparison_sweep, sweep
from poetlab.reproduction.tables import write_table

from poetlab.cli.common import log


def _baselines(rows: pd.DataFrame) -> dict[str, object]:
    from poetlab.planners.comparison import comparison_metrics

    return comparison_metrics(rows)


def _fig3(rows: pd.DataFrame) -> dict[str, object]:
    from poetlab.reproduction.fig3_frontier import frontier_metrics

    return frontier_metrics(rows)


def _fig4(rows: pd.DataFrame) -> dict[str, object]:
    from poetlab.reproduction.fig4_runtime import runtime_metrics

    return runtime_metrics(rows)


def _fig5(rows: pd.DataFrame) -> dict[str, object]:
    from poetlab.reproduction.fig5_capuchin import capuchin_metrics

    return capuchin_metrics(rows)


def _table3(rows: pd.DataFrame) -> dict[str, object]:
    from poetlab.reproduction.table3_pofo import pofo_metrics, pofo_table

    return pofo_metrics(pofo_table(rows))


#: The stages whose work is a sweep, and the metrics their notebooks compute from its rows.
SWEEP_STAGES: dict[str, Callable[[pd.DataFrame], dict[str, object]]] = {
    "baselines": _baselines, "fig3_frontier": _fig3, "fig4_runtime": _fig4, "fig5_capuchin": _fig5, "table3_pofo": _table3,
}


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.stage not in SWEEP_STAGES:
        raise InvalidArgumentError(f"stage {args.stage!r} has no sweep; sweep stages: {', '.join(SWEEP_STAGES)}")
    config = stage_config(args.stage, args.preset, args.params)
    if args.stage == "baselines":  # its parameters are comparison_table's
        config = comparison_sweep(**config)
    address = cluster_address(args.cluster, args.params)  # a malformed address fails before any work
    out = Path(args.out)
    if args.stage == "fig4_runtime":  # the configured factors plus each case's window, as its notebook runs them
        from poetlab.reproduction.fig4_runtime import runtime_metrics, window_sweep

        rows, thresholds = window_sweep(config, address, args.params)
        metrics = runtime_metrics(rows, thresholds=thresholds)
    else:
        rows = sweep(config, address, args.params)
        metrics = SWEEP_STAGES[args.stage](rows)
    write_table(rows, out / "results" / args.stage)
    write_json_atomic(out / "metrics" / f"{args.stage}.json", metrics)
    where = f"the Dask cluster at {address}" if address else f"{config.workers} local process(es)"
    print(f"{args.stage}: {len(rows)} rows from {where} -> {out / 'results' / args.stage}.csv, {out / 'metrics' / args.stage}.json")
    log.info("wrote %s", out)
    return 0

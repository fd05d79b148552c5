"""``poetlab execute``: plan a traced torch model at a RAM budget and run it for real beside plain PyTorch."""

from __future__ import annotations

import argparse
import json
import sys

from poetlab.errors import InvalidArgumentError
from poetlab.planners.poet.solver import solve

from poetlab.cli.common import EXIT_NO_SCHEDULE, graph_and_costs

#: `execute`'s exit status when a step's measured peak went over the RAM budget
EXIT_OVER_BUDGET = 3


def cmd_execute(args: argparse.Namespace) -> int:
    import statistics

    import torch

    from poetlab.torch.execute import retain_freed_memory
    from poetlab.torch.finetune import compare_training
    from poetlab.torch.models import TORCH_MODELS, build_torch_model
    from poetlab.torch.user_models import is_user_model

    if args.model not in TORCH_MODELS and not is_user_model(args.model):
        raise InvalidArgumentError(f"only traced torch models can be executed, not {args.model!r}; valid: {', '.join(TORCH_MODELS)}")
    graph, costs = graph_and_costs(args)
    result = solve(graph, costs, args.ram_budget, time_limit_s=args.time_limit)
    if result.schedule is None:
        print(f"{result.status}: {result.message}")
        return EXIT_NO_SCHEDULE
    model = build_torch_model(args.model, args.batch_size)
    retain_freed_memory()  # (this process runs schedules: no page faults for memory freed mid-step)
    comparison = compare_training(
        model.module, graph, result.schedule, model.loss_fn, [(model.inputs, model.targets)] * args.steps,
        lambda params: torch.optim.SGD(params, lr=args.lr), progress=sys.stderr.isatty(),
        prefetch=args.prefetch, paging_dir=args.paging_dir,
    )
    row = {
        "model": args.model, "platform": costs.platform, "batch_size": args.batch_size, "ram_budget_bytes": args.ram_budget,
        "solver_status": result.status, "predicted_peak_bytes": result.peak_ram_bytes, "predicted_runtime_s": result.runtime_s,
        "measured_peak_bytes": max(comparison.scheduled_peak_bytes), "plain_peak_bytes": max(comparison.plain_peak_bytes),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.module.parameters()),
        **{k: v for k, v in comparison.to_dict().items() if not isinstance(v, list)},
    }
    if args.json:
        print(json.dumps(row, indent=2))
    else:
        print(
            f"{args.model} on {costs.platform}, {args.steps} steps under {int(args.ram_budget):,} bytes ({result.status} schedule: "
            f"{comparison.n_recomputes} recomputes, {comparison.n_pageouts} page-outs per step): losses and parameters "
            f"{'identical to plain PyTorch' if comparison.identical else 'DIFFER from plain PyTorch'}; peak without parameter gradients "
            f"{row['measured_peak_bytes']:,} bytes measured (plain PyTorch {row['plain_peak_bytes']:,}; simulator {result.peak_ram_bytes:,}); "
            f"step {statistics.median(comparison.scheduled_runtime_s) * 1e3:.4g} ms CPU + paging (plain {statistics.median(comparison.plain_cpu_s) * 1e3:.4g} ms CPU, "
            f"simulator {result.runtime_s * 1e3:.4g} ms; wall {statistics.median(comparison.scheduled_wall_s) * 1e3:.4g} ms, plain {statistics.median(comparison.plain_wall_s) * 1e3:.4g} ms)"
        )
    if row["measured_peak_bytes"] > args.ram_budget:  # (a budget is a budget: never silent)
        print(
            f"poetlab: warning: measured peak {row['measured_peak_bytes']:,} bytes is over the RAM budget {int(args.ram_budget):,} bytes "
            f"(simulator {result.peak_ram_bytes:,}, workspaces included); raise --ram-budget", file=sys.stderr,
        )
        return EXIT_OVER_BUDGET
    return 0 if comparison.identical else EXIT_NO_SCHEDULE

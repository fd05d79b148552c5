"""Fine-tune a small CNN on scikit-learn's digits under a POET schedule, beside plain PyTorch.

A 6-block CNN (:class:`poetlab.torch.finetune.DigitsCNN`, BatchNorm and dropout) is traced with fusion,
POET's MILP plans it on the a72 platform's costs at half the checkpoint-all peak (the schedule mixes
recomputation and paging), and both runs train from the same weights and RNG state for ``--steps`` SGD
steps. Writes ``experiments/execute/finetune_digits.json`` (per-step losses, wall times, allocator
peaks, the prediction) and the figure ``experiments/execute/finetune_digits.{png,pdf}``.

    PYTHONPATH=src python benchmarks/finetune_digits.py [--steps 300] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

import poetlab
from poetlab.core.files import write_json_atomic
from poetlab.torch.execute import retain_freed_memory
from poetlab.torch.finetune import DigitsCNN, compare_training, digits_batches
from poetlab.reproduction.plotting import save_figures, training_figure
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.torch.trace import trace

OUT = Path(__file__).resolve().parents[1] / "experiments" / "execute"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--budget-fraction", type=float, default=0.5, help="RAM budget as a fraction of checkpoint-all's peak")
    parser.add_argument("--platform", default="a72")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    retain_freed_memory()  # (plain and scheduled steps alike: one process)
    torch.manual_seed(0)
    module = DigitsCNN()
    batches = digits_batches(args.batch_size, args.steps, seed=0)
    loss_fn = nn.CrossEntropyLoss()
    graph = trace(module, batches[0][0], loss_fn, batches[0][1], fuse=True, name="digits_cnn")
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform(args.platform))
    full = simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes
    budget = args.budget_fraction * full
    solved = poetlab.solve(graph, costs, budget, time_limit_s=60)
    if solved.schedule is None:
        print(f"no schedule at {budget:,.0f} bytes: {solved.message}", file=sys.stderr)
        return 1
    comparison = compare_training(
        module, graph, solved.schedule, loss_fn, batches, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), progress=True
    )
    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    row = {
        "model": "digits_cnn (DigitsCNN width 16, depth 6, fused trace)",
        "data": "sklearn.datasets.load_digits, 1797 8x8 images scaled to [0, 1]",
        "batch_size": args.batch_size,
        "platform_costs": args.platform,
        "threads": args.threads,
        "checkpoint_all_peak_bytes": full,
        "ram_budget_bytes": budget,
        "predicted_peak_bytes": solved.peak_ram_bytes,
        "param_bytes": param_bytes,
        "solver_status": solved.status,
        "n_recomputes_planned": solved.n_recomputes,
        "n_pageouts_planned": solved.n_pageouts,
        "max_scheduled_peak_bytes": max(comparison.scheduled_peak_bytes),
        "max_plain_peak_bytes": max(comparison.plain_peak_bytes),
        "final_loss": comparison.scheduled_losses[-1],
        **comparison.to_dict(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "finetune_digits.json", row)
    title = (
        f"digits CNN, {args.steps} SGD steps, budget {budget / 1e6:.2f} MB = {args.budget_fraction:.0%} of checkpoint-all "
        f"({solved.n_recomputes} recomputes, {solved.n_pageouts} page-outs per step): curves {'identical' if comparison.identical else 'DIFFER'}"
    )
    fig = training_figure(comparison.plain_losses, comparison.scheduled_losses, comparison.scheduled_peak_bytes,
                          comparison.plain_peak_bytes, solved.peak_ram_bytes, title)
    save_figures(fig, args.out / "finetune_digits")
    print(
        f"identical={comparison.identical} final loss {comparison.scheduled_losses[-1]:.4f}; peak without parameter gradients "
        f"{max(comparison.scheduled_peak_bytes):,} B measured (plain {max(comparison.plain_peak_bytes):,} B, simulator "
        f"{solved.peak_ram_bytes:,} B); step {statistics.median(comparison.scheduled_runtime_s) * 1e3:.2f} ms CPU + paging vs plain "
        f"{statistics.median(comparison.plain_cpu_s) * 1e3:.2f} ms CPU (wall {statistics.median(comparison.scheduled_wall_s) * 1e3:.2f} ms vs "
        f"{statistics.median(comparison.plain_wall_s) * 1e3:.2f} ms)"
    )
    return 0 if comparison.identical else 1


if __name__ == "__main__":
    sys.exit(main())

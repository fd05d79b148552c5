"""oneDNN against PyTorch's native convolutions: a plain step's measured peak against the simulator's, and its time.

Why the executor runs on native kernels (NOTE [kernel choice] in ``poetlab.torch.kernels``): for each model, a
plain training step's allocator peak (parameter gradients left out) with oneDNN on and off, beside the
simulator's checkpoint-all peak and the executor's im2col allowance, and the step's median thread CPU
time (one thread, the two settings interleaved). Each case runs twice: on the kernels this CPU dispatches
for, and in a child process made to dispatch as an AVX2-only CPU does (``ATEN_CPU_CAPABILITY=avx2``,
``ONEDNN_MAX_CPU_ISA=AVX2``), where oneDNN keeps the most workspace.

    python benchmarks/bench_kernels.py            # writes experiments/benchmarks/kernels.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

import poetlab
from poetlab.core.files import write_text_atomic
from poetlab.torch.allocations import measure_allocations
from poetlab.torch.execute import memory_allowance_bytes
from poetlab.torch.kernels import cpu_capability, planned_kernels
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.torch.models import MobileNetV2, ResNet18, build_torch_model
from poetlab.torch.trace import trace

OUT = Path(__file__).resolve().parents[1] / "experiments" / "benchmarks" / "kernels.json"
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _test_case(name: str):
    """The test suite's small models (tests/execute_cases.py), seeded as there."""
    generator = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    if name == "test ResNet-18 w8":
        return ResNet18(10, width=8).train(), torch.randn(2, 3, 16, 16, generator=generator), torch.tensor([1, 7]), nn.CrossEntropyLoss()
    return MobileNetV2(10, 0.35).train(), torch.randn(2, 3, 32, 32, generator=generator), torch.tensor([3, 4]), nn.CrossEntropyLoss()


#: (label, batch size, fused trace, builder): the test sizes, then the realistic sizes of the executor benchmark
CASES = [
    ("test ResNet-18 w8", 2, False, None),
    ("test ResNet-18 w8", 2, True, None),
    ("test MobileNetV2 x0.35", 2, True, None),
    ("resnet18_cifar_torch", 32, True, "torch"),
    ("mobilenetv2_torch", 16, True, "torch"),
    ("bert_small_torch", 32, True, "torch"),
]


def _plain_step(module, inputs, targets, loss_fn) -> float:
    """Thread CPU seconds of one plain step; the gradients are dropped after it."""
    start = time.thread_time()
    loss_fn(module(inputs), targets).backward()
    seconds = time.thread_time() - start
    module.zero_grad(set_to_none=True)
    return seconds


def _peak(module, inputs, targets, loss_fn) -> int:
    module.zero_grad(set_to_none=True)
    with measure_allocations() as allocation:
        loss_fn(module(inputs), targets).backward()
    peak = allocation.peak_excluding(p.grad.data_ptr() for p in module.parameters() if p.grad is not None)
    module.zero_grad(set_to_none=True)
    return peak


def run_case(label: str, batch_size: int, fuse: bool, source: str | None, repeats: int) -> dict[str, object]:
    if source == "torch":
        built = build_torch_model(label, batch_size)
        module, inputs, targets, loss_fn = built.module, built.inputs, built.targets, built.loss_fn
    else:
        module, inputs, targets, loss_fn = _test_case(label)
    graph = trace(module, inputs, loss_fn, targets, fuse=fuse)
    costs = poetlab.CostModel.from_flops(graph, poetlab.load_platform("a72"))
    row: dict[str, object] = {
        "model": label, "batch_size": batch_size, "fused": fuse, "cpu_capability": cpu_capability(),
        "predicted_checkpoint_all_peak_bytes": simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes,
        "allowance_bytes": memory_allowance_bytes(module, graph),
        "param_bytes": sum(p.numel() * p.element_size() for p in module.parameters()),
    }
    row["plain_peak_onednn_bytes"] = _peak(module, inputs, targets, loss_fn)
    with planned_kernels():
        row["plain_peak_native_bytes"] = _peak(module, inputs, targets, loss_fn)
    onednn, native = [], []
    for i in range(repeats + 2):  # (two warm-up pairs, then the settings interleaved)
        a = _plain_step(module, inputs, targets, loss_fn)
        with planned_kernels():
            b = _plain_step(module, inputs, targets, loss_fn)
        if i >= 2:
            onednn.append(a)
            native.append(b)
    row["median_step_onednn_s"], row["median_step_native_s"] = statistics.median(onednn), statistics.median(native)
    row["native_vs_onednn_time"] = row["median_step_native_s"] / row["median_step_onednn_s"] - 1.0
    bound = row["predicted_checkpoint_all_peak_bytes"] + row["allowance_bytes"]
    row["onednn_within_model"], row["native_within_model"] = row["plain_peak_onednn_bytes"] <= bound, row["plain_peak_native_bytes"] <= bound
    return row


def _cases_here(repeats: int) -> list[dict[str, object]]:
    torch.set_num_threads(1)
    return [run_case(label, batch, fuse, source, repeats) for label, batch, fuse, source in CASES]


def _table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| CPU kernels | model | batch | fused | predicted checkpoint-all | + allowance | plain peak, oneDNN | plain peak, native | step oneDNN | step native | native vs oneDNN |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cpu_capability']} | {r['model']} | {r['batch_size']} | {'yes' if r['fused'] else 'no'} | {r['predicted_checkpoint_all_peak_bytes']:,} | "
            f"{r['allowance_bytes']:,} | {r['plain_peak_onednn_bytes']:,}{'' if r['onednn_within_model'] else ' (over)'} | "
            f"{r['plain_peak_native_bytes']:,}{'' if r['native_within_model'] else ' (over)'} | {r['median_step_onednn_s'] * 1e3:.2f} ms | "
            f"{r['median_step_native_s'] * 1e3:.2f} ms | {r['native_vs_onednn_time']:+.1%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--here-only", action="store_true", help="(internal) run on this process's kernels and print the rows as JSON")
    args = parser.parse_args()
    if args.here_only:
        print(json.dumps(_cases_here(args.repeats)))
        return
    rows = _cases_here(args.repeats)
    if cpu_capability() != "AVX2":
        child = subprocess.run(
            [sys.executable, __file__, "--here-only", "--repeats", str(args.repeats)],
            capture_output=True, text=True, env=dict(os.environ, **AVX2), check=True,
        )
        rows += json.loads(child.stdout.strip().splitlines()[-1])
    write_text_atomic(args.out, json.dumps({"torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    print(_table(rows))


if __name__ == "__main__":
    main()

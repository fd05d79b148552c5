"""What a recompute costs beyond its own operations: the caches it evicts, which the backward pass then misses.

    PYTHONPATH=src python benchmarks/bench_cache_disruption.py [--repeats 20] [--out FILE]

A recompute in the backward pass reruns a forward node on inputs produced long before, writing fresh
tensors: on a CPU this evicts the gradients and saved tensors the next backward operations would have
found in cache. The simulator prices a recompute at the node's probed time (a warm loop) and cannot see
this; ``benchmarks/bench_execute.py`` counts it in the executor's own time (step time less the reruns'
time and the paging's, over a plain step).

This benchmark measures the effect without the executor: a plain MobileNetV2 x0.35 (128x128) step whose
backward pass writes a buffer larger than the last-level cache (``--flush-mib``) before the backward of
the ``k`` convolutions nearest the input (where POET's schedules recompute), against the same step
without, interleaved. ``slowdown_beyond_flush_s`` is the backward pass's extra time less the writes' own:
what the rest of the backward pass loses to cold caches. One torch thread, thread CPU time, medians.
A 64 MiB write evicts far more than a rerun does, so this is an upper bound: ``bench_execute.py``'s
hand step (a plain step doing a schedule's reruns and paging by hand) measures the real effect: at most
~3% of a plain step.

Writes experiments/benchmarks/cache_disruption.json.
"""

from __future__ import annotations

import argparse
import os
import platform as host
import statistics
import time
from pathlib import Path

import torch

from poetlab.core.files import write_json_atomic
from poetlab.torch.execute import retain_freed_memory
from poetlab.torch.models import build_torch_model
from poetlab.torch.kernels import planned_kernels

OUT = Path(__file__).resolve().parents[1] / "experiments" / "benchmarks" / "cache_disruption.json"
#: (batch size, number of convolutions whose backward a flush precedes): the recompute counts of POET's
#: MobileNetV2 schedules at half of checkpoint-all's peak in bench_execute.py (8 at x2, 7-18 at x16)
CASES = [(2, 8), (16, 8), (16, 18)]


def _early_convolutions(loss: torch.Tensor, k: int) -> list[object]:
    """The autograd nodes of the ``k`` convolutions nearest the input."""
    found, stack, seen = [], [loss.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if "Convolution" in type(fn).__name__:
            found.append(fn)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return sorted(found, key=lambda fn: fn._sequence_nr())[:k]


def run_case(batch_size: int, k: int, flush_mib: int, repeats: int) -> dict[str, object]:
    model = build_torch_model("mobilenetv2_torch", batch_size)
    module, buffer, flushing = model.module, torch.zeros(flush_mib * 2**20 // 4), [0.0]

    def flush(*_):
        start = time.thread_time()
        buffer.add_(1.0)
        flushing[0] += time.thread_time() - start

    def backward_s(with_flush: bool) -> tuple[float, float]:
        for p in module.parameters():
            p.grad = None
        loss = model.loss_fn(module(model.inputs), model.targets)
        if with_flush:
            for fn in _early_convolutions(loss, k):
                fn.register_prehook(flush)
        flushing[0] = 0.0
        start = time.thread_time()
        loss.backward()
        return time.thread_time() - start, flushing[0]

    plain, flushed, flush_s = [], [], []
    for i in range(repeats + 3):
        a, _ = backward_s(False)
        b, f = backward_s(True)
        if i >= 3:  # (three warm-up pairs)
            plain.append(a)
            flushed.append(b)
            flush_s.append(f)
    row = {
        "model": "mobilenetv2_torch", "batch_size": batch_size, "n_flushes": k, "flush_mib": flush_mib,
        "median_backward_s": statistics.median(plain), "median_flushed_backward_s": statistics.median(flushed),
        "median_flush_s": statistics.median(flush_s),
        "slowdown_beyond_flush_s": statistics.median(b - f - a for a, b, f in zip(plain, flushed, flush_s, strict=True)),
    }
    row["slowdown_beyond_flush_vs_backward"] = row["slowdown_beyond_flush_s"] / row["median_backward_s"]
    print(f"MobileNetV2 x{batch_size}, {k} flushes of {flush_mib} MiB: backward {row['median_backward_s'] * 1e3:.2f} ms, "
          f"+{row['slowdown_beyond_flush_s'] * 1e3:.2f} ms beyond the flushes' own {row['median_flush_s'] * 1e3:.2f} ms")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--flush-mib", type=int, default=64)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    retained = retain_freed_memory()
    rows = [run_case(batch_size, k, args.flush_mib, args.repeats) for batch_size, k in CASES]
    write_json_atomic(args.out, {
        "benchmark": "cache_disruption",
        "host": {"machine": host.machine(), "python": host.python_version(), "torch": torch.__version__, "threads": 1, "cpus": os.cpu_count(), "allocator_retains_freed_memory": retained},
        "rows": rows,
    })


if __name__ == "__main__":
    with planned_kernels():  # (every step on the executor's kernels: NOTE [kernel choice] in poetlab.torch.kernels)
        main()

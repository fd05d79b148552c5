"""Executed schedules vs the simulator: peak memory and time, per model and budget, on this host.

    PYTHONPATH=src python benchmarks/bench_execute.py [--models M ...] [--repeats 5] [--out FILE]

For each traced model (fused graphs, real sizes: ResNet-18 CIFAR, MobileNetV2 x0.35 at 128x128, the
small encoder) the host is profiled first (``poetlab.torch.profile.profile_host``: per-node times, paging to
real files with fsync, one thread), which gives the cost model of the simulator's time prediction. POET's
MILP then plans each budget (a fraction of the way from the smallest footprint to checkpoint-all's peak,
with the bytes ``solve`` keeps free: ``budget_ladder``; 1.0 is checkpoint-all itself, no recompute, no paging; ResNet-18 at 50% also by POET's paging-only arm, ``planner: paging_only``, since
the free MILP pages or not from run to run; each plan is kept in ``data/schedules`` and run again by later
runs, ``--replan`` plans them anew: ``planned_schedule``) and the schedule is executed ``repeats`` times, interleaved with plain PyTorch
steps on the same copy of the model (and with prefetching page-ins where the schedule pages), in a
rotating order (at least ``--repeats`` steps of each, and enough to time 3 s of plain steps, up to 300:
a small step's median moves more). The C allocator keeps freed memory for reuse (``poetlab.torch.execute.retain_freed_memory``,
process-wide, so for plain steps too), and each step's minor page faults are recorded
(``median_page_faults`` beside ``median_plain_page_faults``):

- ``grads_equal``: the first executed step's parameter gradients equal the plain step's, bit for bit;
- ``measured_peak_bytes``: the allocator's peak (profiler memory events) of one more step, beside the
  simulator's ``predicted_peak_bytes`` and the allowance (``memory_allowance_bytes``: one operation's workspace);
  parameter gradients are left out of the measured peak by address (``measured_total_peak_bytes`` has
  them), as POET keeps them outside the activation budget;
- time: the profile's node times are thread CPU times (other processes' load does not inflate them), so
  the executed step is measured the same way: ``median_runtime_s`` = CPU time outside paging + the wall
  time of the page-outs and page-ins (waiting for the disk is not CPU time), against
  ``predicted_runtime_s`` (the simulator: profiled node times + the profile's disk fit). CPU time of the
  checkpoint-all schedule against a plain step's (``cpu_time_vs_plain`` at budget 1.0) is the executor's
  own overhead; at every budget, ``machinery_overhead_vs_plain`` is the executed step's CPU time less the
  reruns' (``ExecutionResult.recompute_cpu_s``) and the paging's, over a plain step: the cost of our
  machinery beyond the work the schedule asks for. ``recompute_vs_prediction`` compares the reruns' time
  with the simulator's price for them, and ``overhead_beyond_predicted_vs_plain`` is the executed runtime
  less a plain step less what the simulator says the schedule adds, over a plain step (both errors
  together). Every step is timed whole: the executor's from its call to its return (set-up and clean-up:
  the buffers' backup, the paging directory made and removed; ``ExecutionResult.cpu_s``), and plain and
  hand steps with their autograd graph let go inside the time, as the executor's step does it. Wall-clock figures are kept beside
  (``median_wall_s``, ``time_vs_plain``), noisy on a shared machine. Profiled node times run alone do not
  add up to a whole step (``profiled_node_sum_s`` vs ``profiled_plain_step_s``); the cost model scales
  them to the measured step (``CostModel.from_profile``, calibrated), and ``uncalibrated_predicted_runtime_s``
  is the prediction from the raw node times. This shared machine's speed drifts by up to ~10% between the
  profile and a case's steps (the plain steps of one run vary that much from case to case), so
  ``runtime_vs_prediction_relative_to_plain`` also compares the two ratios, executed over the plain steps
  timed beside it against predicted over the profiled plain step: the prediction's error with the drift
  taken out.

A rerun or a page-out may also cost the rest of the step something no timer around it sees: it evicts
from the caches what the next operations would have found there. So each case also times ``HandStep``,
a plain step that does the schedule's reruns and paging by hand, without the executor
(``hand_step_grads_equal`` checks it is the same step): ``hand_side_effect_vs_plain`` is its time less
its reruns' and its paging calls' over a plain step, and ``machinery_overhead_vs_hand_step`` the
executed step's CPU time less the hand step's (both without their paging calls' CPU time), over a plain
step: the executor's own time with what recomputing and paging cost by themselves taken out. Plain,
executed and hand steps all run on one copy of the model (gradients reset before each), as
``ab_execute.py``'s do: ``plain_control_vs_plain`` times plain steps on a second copy beside them, and
shows what that leaves out (where the copies lie moves a small step by a few hundred microseconds).

Where the schedule only recomputes, each node at most once, the same reruns are also done by the tool a
PyTorch user reaches for, ``torch.utils.checkpoint`` (``CheckpointStep``: each run of consecutive rerun
nodes checkpointed, ``checkpoint_grads_equal`` checks it is the same step): ``executed_vs_checkpoint`` is
the executed step's CPU time less the checkpoint step's, over a plain step; below zero, the executor's
machinery costs less than PyTorch's own for the same reruns. ``executed_vs_reentrant_checkpoint`` does the
same against checkpoint's reentrant implementation, whose forward pass runs the checkpointed nodes with
grad off (no autograd graph built, nothing saved, no hook) and whose backward reruns them and runs the
engine once more on their graph: what a first run without autograd's graph would save the executor.

The executor's own cost is roughly fixed per step (Python work per node it manages, per fx node it runs),
so its share of a step falls as nodes grow: ``overhead_by_batch`` times the checkpoint-all schedule
(no node managed) against plain steps at several batch sizes (thread CPU time, interleaved, median and
minimum of ``--repeats``).

Writes experiments/benchmarks/execute.json.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import platform as host
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import poetlab
from poetlab.core.files import write_json_atomic
from poetlab.torch.allocations import measure_allocations
from poetlab.torch.execute import ScheduleExecutor, memory_allowance_bytes, retain_freed_memory
from poetlab.torch.profile import profile_host
from poetlab.core.schedule import checkpoint_all_schedule, simulate
from poetlab.torch.models import build_torch_model
from poetlab.torch.trace import trace
from poetlab.planners.comparison import budget_ladder
from poetlab.planners.kept_plans import PAGING_ONLY, planned_schedule
from poetlab.torch.reference_steps import CheckpointStep, HandStep
from poetlab.torch.kernels import planned_kernels

# (model, batch size, budget fractions of checkpoint-all's peak, each planned by POET's MILP, or by its
# paging-only arm where marked: the free MILP may well recompute rather than page, and every run must page)
# (the executor's own cost is per node it manages, so its share of a step falls with the batch: the
# small-node models also run at a larger batch)
CASES = [
    ("resnet18_cifar_torch", 4, (1.0, 0.7, 0.5, (0.5, PAGING_ONLY))),
    ("mobilenetv2_torch", 2, (1.0, 0.7, 0.5)),
    ("mobilenetv2_torch", 16, (1.0, 0.7, 0.5)),
    ("bert_small_torch", 8, (1.0, 0.5)),
    ("bert_small_torch", 32, (1.0, 0.5)),
]
#: (model, batch sizes) of the checkpoint-all overhead sweep
SWEEP = [("resnet18_cifar_torch", (4, 16)), ("mobilenetv2_torch", (2, 8, 16)), ("bert_small_torch", (8, 32))]
OUT = Path(__file__).resolve().parents[1] / "experiments" / "benchmarks" / "execute.json"
#: where the cases' plans are kept (planned_schedule)
SCHEDULES = Path(__file__).resolve().parents[1] / "data" / "schedules"


def _plain(module, inputs, targets, loss_fn) -> tuple[float, float]:
    """(wall, thread CPU) seconds of one plain step."""
    start, cpu = time.perf_counter(), time.thread_time()
    loss_fn(module(inputs), targets).backward()
    return time.perf_counter() - start, time.thread_time() - cpu


def _page_faults() -> int:
    """Minor page faults of this process so far (a fresh page of memory touched for the first time)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _interleaved(runs: dict[str, object], repeats: int) -> dict[str, list]:
    """Each of ``runs`` (name -> a callable returning a sample) ``repeats`` times, interleaved and in a
    rotating order, so that load from other processes and cache warmth from the step before hit all alike."""
    names, samples = list(runs), {name: [] for name in runs}
    for k in range(repeats):
        for name in names[k % len(names):] + names[:k % len(names)]:
            samples[name].append(runs[name]())
    return samples


def _drop_grads(module: torch.nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def _same_grads(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether two copies of a model hold the same parameter gradients, bit for bit (None alike)."""
    return all(
        (x.grad is None) == (y.grad is None) and (x.grad is None or torch.equal(x.grad, y.grad))
        for x, y in zip(a.parameters(), b.parameters(), strict=True)
    )




#: the least plain-step time each kind of step of a case is timed for: a 5 ms step's medians over 15 steps moved
#: by +-3% from run to run, so small steps run more of them (up to MAX_STEPS). Raised from 1.5 s and 100 steps:
#: the small steps' own time beyond the hand step moved by about +-1% of a step from run to run, on a target
#: of 5%. Not all of that is the count: ab_execute.py's 400 rounds gave the same executor on the encoder x8 at
#: 98.5% +4.9% to +6.2% in five runs (each run plans its own schedule and lays out its own memory)
MIN_TIMED_S, MAX_STEPS = 3.0, 300




def _steps(repeats: int, step_s: float) -> int:
    """How many steps of each kind to time: ``repeats``, or more for a step shorter than MIN_TIMED_S / repeats."""
    return max(repeats, min(MAX_STEPS, math.ceil(MIN_TIMED_S / step_s)))


def run_case(name: str, batch_size: int, fractions, repeats: int, time_limit_s: float, paging_dir: str, schedules: Path | None = None, replan: bool = False) -> list[dict[str, object]]:
    profile = profile_host(paging_dir, model=name, batch_size=batch_size, fuse=True, repeats=15, threads=1)
    model = build_torch_model(name, batch_size)
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets, fuse=True, name=name)
    costs = poetlab.CostModel.from_profile(graph, profile)
    raw_costs = poetlab.CostModel.from_profile(graph, profile, calibrate=False)
    param_bytes = sum(p.numel() * p.element_size() for p in model.module.parameters())
    rows = []
    for case in fractions:
        fraction, planner = case if isinstance(case, tuple) else (case, "poet")
        (budget,) = budget_ladder(graph, costs, [fraction])
        schedule, status, message = planned_schedule(graph, costs, budget, f"{name}-x{batch_size}-{fraction:g}-{planner}", planner, time_limit_s, schedules, replan)
        if schedule is None:
            rows.append({"model": name, "batch_size": batch_size, "budget_fraction": fraction, "planner": planner, "status": status, "message": message})
            continue
        predicted = simulate(schedule, graph, costs)
        # Every timed step (plain, executed, by hand) runs on one copy of the model, its gradients reset
        # before each, as ab_execute.py's do: where a copy's tensors lie in memory moves a small step by a
        # few hundred microseconds (plain_control_vs_plain), which steps on different copies would add to
        # their difference. ``reference`` only gives the first steps' gradients.
        reference = copy.deepcopy(model.module)
        shared = copy.deepcopy(model.module)
        executor = ScheduleExecutor(shared, graph, schedule, model.loss_fn, paging_dir=paging_dir)
        # the first step of each: gradients compared bit for bit (same RNG state for dropout)
        rng = torch.get_rng_state()
        _plain(reference, model.inputs, model.targets, model.loss_fn)
        torch.set_rng_state(rng)
        first = executor.step(model.inputs, model.targets)
        grads_equal = _same_grads(reference, shared)
        hand = HandStep(shared, graph, schedule, model.loss_fn, paging_dir=paging_dir, rng_nodes={i for i, draws in executor.draws_rng.items() if draws})
        # a second copy of the plain model, made last: plain steps on it against those on the shared one
        # show what the copies' places in memory alone do to a step (seen here: a few hundred microseconds
        # either way on MobileNetV2 x2), what timing every step on one copy leaves out
        control = copy.deepcopy(model.module)
        _drop_grads(shared)
        torch.set_rng_state(rng)
        hand.step(model.inputs, model.targets)
        hand_grads_equal = _same_grads(reference, shared)
        # PyTorch's own tool doing the same reruns, where it can (CheckpointStep): the other machinery
        checkpointed = CheckpointStep.for_schedule(shared, graph, schedule, model.loss_fn)
        reentrant = CheckpointStep.for_schedule(shared, graph, schedule, model.loss_fn, reentrant=True)
        checkpoint_grads_equal = reentrant_grads_equal = None
        if checkpointed is not None:
            _drop_grads(shared)
            torch.set_rng_state(rng)
            checkpointed.step(model.inputs, model.targets)
            checkpoint_grads_equal = _same_grads(reference, shared)
            _drop_grads(shared)
            torch.set_rng_state(rng)
            reentrant.step(model.inputs, model.targets)
            reentrant_grads_equal = _same_grads(reference, shared)
        prefetching = None
        if predicted.n_pageins:
            prefetching = ScheduleExecutor(shared, graph, schedule, model.loss_fn, paging_dir=paging_dir, prefetch=True)
            _drop_grads(shared)
            prefetching.step(model.inputs, model.targets)

        def plain_step():
            _drop_grads(shared)
            faults = _page_faults()
            return (*_plain(shared, model.inputs, model.targets, model.loss_fn), _page_faults() - faults)

        def scheduled_step(ex=executor):
            _drop_grads(shared)
            faults, start = _page_faults(), time.perf_counter()
            stepped = ex.step(model.inputs, model.targets)
            return time.perf_counter() - start, stepped, _page_faults() - faults

        def control_step():
            _drop_grads(control)
            return _plain(control, model.inputs, model.targets, model.loss_fn)[1]

        def hand_step():
            _drop_grads(shared)
            return hand.step(model.inputs, model.targets)

        def checkpoint_step():
            _drop_grads(shared)
            return checkpointed.step(model.inputs, model.targets)

        def reentrant_step():
            _drop_grads(shared)
            return reentrant.step(model.inputs, model.targets)

        steps = _steps(repeats, profile.model.step_runtime_s)
        timed = _interleaved({"plain": plain_step, "scheduled": scheduled_step, "hand": hand_step, "plain_control": control_step, **({"prefetch": lambda: scheduled_step(prefetching)} if prefetching else {}), **({"checkpoint": checkpoint_step, "reentrant": reentrant_step} if checkpointed else {})}, steps)
        plain_s, plain_cpu_s, plain_faults = (list(x) for x in zip(*timed["plain"], strict=True))
        exec_s = [wall for wall, _, _ in timed["scheduled"]]
        exec_cpu_s = [stepped.cpu_s for _, stepped, _ in timed["scheduled"]]
        exec_runtime_s = [stepped.runtime_s for _, stepped, _ in timed["scheduled"]]
        exec_faults = [faults for _, _, faults in timed["scheduled"]]
        # the executor's own time: the step's CPU time less the reruns' and the paging's (the schedule's work)
        exec_own_s = [stepped.cpu_s - stepped.paging_cpu_s - stepped.recompute_cpu_s for _, stepped, _ in timed["scheduled"]]
        exec_recompute_s = [stepped.recompute_cpu_s for _, stepped, _ in timed["scheduled"]]
        predicted_recompute_s = sum(float(costs.recompute_runtime_s[i]) for i in schedule.recomputed_nodes())  # (the batch's included)
        prefetch_s = [wall for wall, _, _ in timed.get("prefetch", [])]
        hand.close()
        reference_cpu_s = [cpu for cpu, _, _ in timed["hand"]]
        reference_rerun_s = [rerun for _, rerun, _ in timed["hand"]]
        reference_paging_s = [paging for _, _, paging in timed["hand"]]
        reference_beyond_paging_s = [cpu - paging for cpu, _, paging in timed["hand"]]
        exec_beyond_paging_s = [stepped.cpu_s - stepped.paging_cpu_s for _, stepped, _ in timed["scheduled"]]
        _drop_grads(shared)
        measured = executor.step(model.inputs, model.targets, measure_memory=True)
        _drop_grads(reference)
        with measure_allocations() as plain_alloc:
            model.loss_fn(reference(model.inputs), model.targets).backward()
        plain_peak = plain_alloc.peak_excluding(p.grad.data_ptr() for p in reference.parameters() if p.grad is not None)
        allowance = memory_allowance_bytes(model.module, graph)
        row = {
            "model": name,
            "batch_size": batch_size,
            "budget_fraction": fraction,
            "planner": planner,
            "timed_steps": steps,
            "ram_budget_bytes": budget,
            "status": status,
            "n_nodes": graph.n_nodes,
            "n_recomputes": predicted.n_recomputes,
            "n_pageouts": predicted.n_pageouts,
            "grads_equal": grads_equal,
            "n_unplanned": first.n_unplanned,
            "n_skipped_ops": first.n_skipped_ops,
            "n_managed_nodes": len(executor.layout.managed),
            "predicted_peak_bytes": predicted.peak_ram_bytes,
            "planned_peak_bytes": measured.planned_peak_bytes,
            "measured_peak_bytes": measured.peak_bytes,
            "measured_total_peak_bytes": measured.total_peak_bytes,
            "plain_measured_peak_bytes": plain_peak,
            "param_bytes": param_bytes,
            "allowance_bytes": allowance,
            "peak_within_allowance": measured.peak_bytes <= predicted.peak_ram_bytes + allowance,
            "bytes_written": measured.bytes_written,
            "bytes_read": measured.bytes_read,
            "predicted_runtime_s": predicted.runtime_s,
            "uncalibrated_predicted_runtime_s": simulate(schedule, graph, raw_costs).runtime_s,
            "predicted_compute_time_s": predicted.compute_time_s,
            "predicted_paging_time_s": predicted.paging_time_s,
            "profiled_plain_step_s": profile.model.step_runtime_s,
            "profiled_node_sum_s": profile.model.node_runtime_sum_s,
            "median_page_faults": statistics.median(exec_faults),
            "median_plain_page_faults": statistics.median(plain_faults),
            "median_cpu_s": statistics.median(exec_cpu_s),
            "median_plain_cpu_s": statistics.median(plain_cpu_s),
            "cpu_time_vs_plain": statistics.median(exec_cpu_s) / statistics.median(plain_cpu_s) - 1,
            "min_cpu_time_vs_plain": min(exec_cpu_s) / min(plain_cpu_s) - 1,
            "schedule_extra_s": predicted.runtime_s - costs.plain_step_runtime_s,
            "machinery_overhead_vs_plain": statistics.median(exec_own_s) / statistics.median(plain_cpu_s) - 1,
            "overhead_beyond_predicted_vs_plain": (statistics.median(exec_runtime_s) - (predicted.runtime_s - costs.plain_step_runtime_s)) / statistics.median(plain_cpu_s) - 1,
            # the reference: a plain step doing the same reruns and paging by hand (HandStep), no executor
            "n_hand_reruns": hand.n_reruns,
            "n_hand_pageouts": hand.n_pageouts,
            "hand_step_grads_equal": hand_grads_equal,
            "median_hand_step_cpu_s": statistics.median(reference_cpu_s),
            "median_hand_rerun_cpu_s": statistics.median(reference_rerun_s),
            "median_hand_paging_cpu_s": statistics.median(reference_paging_s),
            # what the reruns and the paging cost the rest of a plain step (the caches they evict), over a plain step
            "hand_side_effect_vs_plain": statistics.median(b - r for b, r in zip(reference_beyond_paging_s, reference_rerun_s, strict=True)) / statistics.median(plain_cpu_s) - 1,
            # the executor's own time: its step less the hand step, both with their paging calls' CPU time left out, over a plain step
            "machinery_overhead_vs_hand_step": (statistics.median(exec_beyond_paging_s) - statistics.median(reference_beyond_paging_s)) / statistics.median(plain_cpu_s),
            # the same reruns by torch.utils.checkpoint (CheckpointStep; None where the schedule pages or reruns a node twice)
            "checkpoint_runs": checkpointed.runs if checkpointed else None,
            "checkpoint_grads_equal": checkpoint_grads_equal,
            "median_checkpoint_cpu_s": statistics.median(timed["checkpoint"]) if checkpointed else None,
            "checkpoint_vs_plain": statistics.median(timed["checkpoint"]) / statistics.median(plain_cpu_s) - 1 if checkpointed else None,
            # the executed step less the checkpoint step, over a plain step: one machinery against the other
            "executed_vs_checkpoint": (statistics.median(exec_cpu_s) - statistics.median(timed["checkpoint"])) / statistics.median(plain_cpu_s) if checkpointed else None,
            # the same with checkpoint's reentrant implementation (no autograd graph for the runs in the forward pass)
            "reentrant_checkpoint_grads_equal": reentrant_grads_equal,
            "median_reentrant_checkpoint_cpu_s": statistics.median(timed["reentrant"]) if checkpointed else None,
            "reentrant_checkpoint_vs_plain": statistics.median(timed["reentrant"]) / statistics.median(plain_cpu_s) - 1 if checkpointed else None,
            "executed_vs_reentrant_checkpoint": (statistics.median(exec_cpu_s) - statistics.median(timed["reentrant"])) / statistics.median(plain_cpu_s) if checkpointed else None,
            "median_plain_control_cpu_s": statistics.median(timed["plain_control"]),
            "plain_control_vs_plain": statistics.median(timed["plain_control"]) / statistics.median(plain_cpu_s) - 1,
            "median_recompute_cpu_s": statistics.median(exec_recompute_s),
            "predicted_recompute_s": predicted_recompute_s,
            "recompute_vs_prediction": statistics.median(exec_recompute_s) / predicted_recompute_s - 1 if predicted_recompute_s else None,
            "median_runtime_s": statistics.median(exec_runtime_s),
            "runtime_vs_prediction": statistics.median(exec_runtime_s) / predicted.runtime_s - 1,
            # the same, with the machine's drift between the profile and this case taken out: the executed
            # step over the plain steps timed beside it, against the prediction over the profiled plain step
            "runtime_vs_prediction_relative_to_plain": (statistics.median(exec_runtime_s) / statistics.median(plain_cpu_s))
            / (predicted.runtime_s / costs.plain_step_runtime_s) - 1,
            "plain_cpu_vs_profiled_node_sum": statistics.median(plain_cpu_s) / profile.model.node_runtime_sum_s - 1,
            "median_wall_s": statistics.median(exec_s),
            "min_wall_s": min(exec_s),
            "min_plain_wall_s": min(plain_s),
            "min_time_vs_plain": min(exec_s) / min(plain_s) - 1,
            "median_prefetch_wall_s": statistics.median(prefetch_s) if prefetch_s else None,
            "min_prefetch_wall_s": min(prefetch_s) if prefetch_s else None,
            "prefetch_wall_s": prefetch_s,
            "median_plain_wall_s": statistics.median(plain_s),
            "wall_s": exec_s,
            "plain_wall_s": plain_s,
            "time_vs_prediction": statistics.median(exec_s) / predicted.runtime_s - 1,
            "time_vs_plain": statistics.median(exec_s) / statistics.median(plain_s) - 1,
        }
        rows.append(row)
        tqdm.write(
            f"   CPU {row['median_cpu_s'] * 1e3:.1f} ms vs plain {row['median_plain_cpu_s'] * 1e3:.1f} ms ({row['cpu_time_vs_plain']:+.1%}); "
            f"runtime (CPU + paging wall) {row['median_runtime_s'] * 1e3:.1f} ms vs predicted {predicted.runtime_s * 1e3:.1f} ms ({row['runtime_vs_prediction']:+.1%}); "
            f"own time {row['machinery_overhead_vs_plain']:+.1%} of plain, {row['machinery_overhead_vs_hand_step']:+.1%} beyond a step doing its "
            f"{hand.n_reruns} reruns and {hand.n_pageouts} page-outs by hand (whose side effect is {row['hand_side_effect_vs_plain']:+.1%}); "
            f"a second plain copy {row['plain_control_vs_plain']:+.1%}"
            + (f"; torch.utils.checkpoint doing its reruns {row['checkpoint_vs_plain']:+.1%} of plain, the executor {row['executed_vs_checkpoint']:+.1%} of plain against it, "
               f"{row['executed_vs_reentrant_checkpoint']:+.1%} against its reentrant version" if checkpointed else "")
        )
        tqdm.write(
            f"{name} x{batch_size} @ {fraction:.2f} ({planner}): {status}, {row['n_recomputes']} recomputes, {row['n_pageouts']} page-outs; grads equal {grads_equal}; "
            f"peak {measured.peak_bytes:,} measured vs {predicted.peak_ram_bytes:,} predicted (+ allowance {allowance:,}); "
            f"time {row['median_wall_s'] * 1e3:.1f} ms vs predicted {predicted.runtime_s * 1e3:.1f} ms ({row['time_vs_prediction']:+.1%}), "
            f"plain {row['median_plain_wall_s'] * 1e3:.1f} ms ({row['time_vs_plain']:+.1%})"
        )
    return rows


def overhead_by_batch(name: str, batch_size: int, repeats: int) -> dict[str, object]:
    """Checkpoint-all through the executor against plain steps, CPU time, interleaved, on one copy of the
    model (see run_case)."""
    model = build_torch_model(name, batch_size)
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets, fuse=True, name=name)
    shared = copy.deepcopy(model.module)
    executor = ScheduleExecutor(shared, graph, checkpoint_all_schedule(graph), model.loss_fn)

    def plain_step():
        _drop_grads(shared)
        return _plain(shared, model.inputs, model.targets, model.loss_fn)[1]

    def scheduled_step():
        _drop_grads(shared)
        return executor.step(model.inputs, model.targets).cpu_s

    timed = _interleaved({"plain": plain_step, "scheduled": scheduled_step}, repeats + 2)
    plain_s, exec_s = timed["plain"][2:], timed["scheduled"][2:]  # (two warm-up steps each)
    row = {
        "model": name, "batch_size": batch_size, "n_nodes": graph.n_nodes,
        "median_plain_cpu_s": statistics.median(plain_s), "median_cpu_s": statistics.median(exec_s),
        "overhead_median": statistics.median(exec_s) / statistics.median(plain_s) - 1,
        "overhead_min": min(exec_s) / min(plain_s) - 1,
        "overhead_per_node_s": (statistics.median(exec_s) - statistics.median(plain_s)) / graph.n_nodes,
    }
    tqdm.write(f"{name} x{batch_size}: checkpoint-all {row['median_cpu_s'] * 1e3:.2f} ms vs plain {row['median_plain_cpu_s'] * 1e3:.2f} ms "
               f"({row['overhead_median']:+.1%} median, {row['overhead_min']:+.1%} min)")
    return row


def _case(row: dict[str, object], budget: bool = True) -> str:
    """A row's key in the summary: ``model xBATCH@FRACTION``, and `` PLANNER`` where it is not POET's MILP."""
    key = f"{row['model']} x{row['batch_size']}"
    if not budget:
        return key
    return f"{key}@{row['budget_fraction']}" + (f" {row['planner']}" if row["planner"] != "poet" else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=sorted({c[0] for c in CASES}))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--paging-dir", default=None, help="where the paging files go (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--schedules", type=Path, default=SCHEDULES, metavar="DIR", help="where each case's plan is kept (MODEL-xBATCH-FRACTION-PLANNER.json) and run again on later runs (default: data/schedules)")
    parser.add_argument("--replan", action="store_true", help="plan every case again with the MILP and keep the new plans")
    parser.add_argument("--malloc-defaults", action="store_true", help="leave glibc's malloc as it is (no retain_freed_memory): to see the page faults it causes")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as profiled
    torch.use_deterministic_algorithms(True)
    retained = False if args.malloc_defaults else retain_freed_memory()  # (plain steps and scheduled ones alike: one process)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.paging_dir) as paging_dir:
        for name, batch_size, fractions in tqdm([c for c in CASES if c[0] in args.models], desc="execute benchmark"):
            rows += run_case(name, batch_size, fractions, args.repeats, args.time_limit, paging_dir, args.schedules, args.replan)
    sweep = [overhead_by_batch(name, batch_size, args.repeats) for name, sizes in SWEEP if name in args.models for batch_size in sizes]
    ok = [r for r in rows if "measured_peak_bytes" in r]
    summary = {
        "all_grads_equal": all(r["grads_equal"] for r in ok),
        "all_peaks_within_allowance": all(r["peak_within_allowance"] for r in ok),
        "checkpoint_all_cpu_overhead_vs_plain": {_case(r, budget=False): float(r["cpu_time_vs_plain"]) for r in ok if r["budget_fraction"] >= 1.0},
        "runtime_vs_prediction": {_case(r): float(r["runtime_vs_prediction"]) for r in ok},
        "checkpoint_all_overhead_vs_plain_median": {_case(r, budget=False): float(r["time_vs_plain"]) for r in ok if r["budget_fraction"] >= 1.0},
        "checkpoint_all_overhead_vs_plain_min": {_case(r, budget=False): float(r["min_time_vs_plain"]) for r in ok if r["budget_fraction"] >= 1.0},
        "machinery_overhead_vs_plain": {_case(r): float(r["machinery_overhead_vs_plain"]) for r in ok},
        "machinery_overhead_vs_hand_step": {_case(r): float(r["machinery_overhead_vs_hand_step"]) for r in ok},
        "hand_side_effect_vs_plain": {_case(r): float(r["hand_side_effect_vs_plain"]) for r in ok},
        "all_hand_step_grads_equal": all(r["hand_step_grads_equal"] for r in ok),
        # the executed step less torch.utils.checkpoint doing the same reruns, over a plain step (where it can)
        "executed_vs_checkpoint": {_case(r): float(r["executed_vs_checkpoint"]) for r in ok if r["executed_vs_checkpoint"] is not None},
        "all_checkpoint_grads_equal": all(r["checkpoint_grads_equal"] for r in ok if r["checkpoint_grads_equal"] is not None),
        "executed_vs_reentrant_checkpoint": {_case(r): float(r["executed_vs_reentrant_checkpoint"]) for r in ok if r.get("executed_vs_reentrant_checkpoint") is not None},
        "all_reentrant_checkpoint_grads_equal": all(r["reentrant_checkpoint_grads_equal"] for r in ok if r.get("reentrant_checkpoint_grads_equal") is not None),
        "plain_control_vs_plain": {_case(r): float(r["plain_control_vs_plain"]) for r in ok},
        "overhead_beyond_predicted_vs_plain": {_case(r): float(r["overhead_beyond_predicted_vs_plain"]) for r in ok},
        "recompute_vs_prediction": {_case(r): float(r["recompute_vs_prediction"]) for r in ok if r["recompute_vs_prediction"] is not None},
        "runtime_within_10pct_of_prediction": all(abs(r["runtime_vs_prediction"]) <= 0.10 for r in ok),
        "runtime_vs_prediction_relative_to_plain": {_case(r): float(r["runtime_vs_prediction_relative_to_plain"]) for r in ok},
        "runtime_within_10pct_of_prediction_relative_to_plain": all(abs(r["runtime_vs_prediction_relative_to_plain"]) <= 0.10 for r in ok),
        "machinery_overhead_under_5pct": all(r["machinery_overhead_vs_plain"] < 0.05 for r in ok),
        "machinery_overhead_vs_hand_step_under_5pct": all(r["machinery_overhead_vs_hand_step"] < 0.05 for r in ok),
        "time_vs_prediction": {_case(r): float(r["time_vs_prediction"]) for r in ok},
        "checkpoint_all_overhead_by_batch": {_case(r, budget=False): float(r["overhead_median"]) for r in sweep},
    }
    write_json_atomic(args.out, {
        "benchmark": "execute",
        "host": {"machine": host.machine(), "python": host.python_version(), "torch": torch.__version__, "threads": 1, "cpus": os.cpu_count(), "allocator_retains_freed_memory": retained},
        "summary": summary,
        "rows": rows,
        "overhead_by_batch": sweep,
    })
    print(summary)


if __name__ == "__main__":
    with planned_kernels():  # (every step on the executor's kernels: NOTE [kernel choice] in poetlab.torch.kernels)
        main()

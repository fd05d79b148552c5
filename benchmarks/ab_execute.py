"""In-process A/B of the executor: this tree's ``poetlab.torch.execute`` against the same module at a git revision.

A change to the executor's own time of a few tens of microseconds does not show in ``bench_execute.py``,
whose small cases move by a few percent of their step from one run to the next (where the tensors of
each copy land in memory, the machine's drift). Here both executors run the same schedules in one
process, interleaved with a plain step and ``bench_execute.py``'s hand step (the schedule's reruns and
paging done by hand) in a rotating order, so that what moves the whole benchmark moves both alike.

Each case is profiled on this host and runs the plan ``bench_execute.py`` keeps for it in
``data/schedules`` (POET's MILP, ``--time-limit`` per solve, where none is kept yet): the same schedules from
one run to the next, which a time-limited solve does not give; every executor's first step must give autograd's gradients bit for bit. All
steps run on one copy of the model: two copies lie in different places in memory, which alone moves a
small step by a few hundred microseconds. ``--base HEAD`` (the same executor twice) shows the floor:
-60 to +20 us a step here.
Each step is timed from outside ``step()`` (thread CPU time, one torch thread), with the paging calls'
own CPU time left out, as the hand step's is; the own time of each executor is its step less the hand
step, over a plain step, and ``new_minus_base_s`` the median of the differences within each round.

Only the executor's package (``src/poetlab/torch/execute/``) comes from the revision (``git show``); the rest
of poetlab is this tree's, so the revision must have the executor as that package, or as the one module
``src/poetlab/torch/execute.py`` it was before the package (loaded as the package's ``__init__``, with the
helpers it imported from ``poetlab.torch.trace`` taken from ``poetlab.torch.probes``, where they moved); one
whose executor needs other modules as they were then cannot be compared this way.

    python benchmarks/ab_execute.py --base HEAD~1 [--case mobilenetv2_torch:2:1.0,0.7,0.5] [--steps N]

Writes experiments/benchmarks/ab_execute.json.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import math
import os
import platform as host
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch
from tqdm.auto import tqdm

import poetlab
from poetlab.core.files import write_json_atomic
from poetlab.torch.execute import retain_freed_memory
from poetlab.torch.profile import profile_host
from poetlab.core.schedule import OpKind, checkpoint_all_schedule, simulate
from poetlab.torch.models import TORCH_MODELS, build_torch_model
from poetlab.torch.trace import trace
from poetlab.torch.kernels import planned_kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_execute import SCHEDULES, _drop_grads, _plain, _same_grads  # noqa: E402

from poetlab.planners.comparison import budget_ladder  # noqa: E402
from poetlab.planners.kept_plans import planned_schedule  # noqa: E402
from poetlab.torch.reference_steps import HandStep  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "benchmarks" / "ab_execute.json"
#: the small steps, where the executor's own time is the largest share (bench_execute.py's worst cases)
CASES = ["mobilenetv2_torch:2:1.0,0.7,0.5", "bert_small_torch:8:1.0,0.985"]
#: rounds dropped at the start (first steps learn, caches and the allocator settle)
WARMUP = 3


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        message = (done.stderr.strip().splitlines() or ["git failed"])[-1]
        raise SystemExit(f"ab_execute: git {' '.join(args)}: {message}; name a commit of this repository with --base")
    return done.stdout


EXECUTOR = "src/poetlab/torch/execute"
#: imports of the one-module executor (``execute.py``) whose names have moved since, as they read now
MOVED_IMPORTS = {"from poetlab.torch.trace import fetch_attr, tensors_in": "from poetlab.torch.probes import fetch_attr, tensors_in"}


def executor_sources(revision: str | None) -> dict[str, str]:
    """The executor package's modules at ``revision`` (None: this tree), by file name."""
    if revision is None:
        return {path.name: path.read_text() for path in (ROOT / EXECUTOR).glob("*.py")}
    package = subprocess.run(["git", "cat-file", "-e", f"{revision}:{EXECUTOR}/__init__.py"], cwd=ROOT, capture_output=True)
    if package.returncode:  # (the one module, or git's error naming the revision where neither is)
        source = _git("show", f"{revision}:{EXECUTOR}.py")
        for old, new in MOVED_IMPORTS.items():
            source = source.replace(old, new)
        return {"__init__.py": source}
    names = _git("ls-tree", "--name-only", f"{revision}:{EXECUTOR}").split()
    return {name: _git("show", f"{revision}:{EXECUTOR}/{name}") for name in names if name.endswith(".py")}


def load_executor(sources: dict[str, str], name: str) -> ModuleType:
    """``sources`` (a version of the executor package) loaded as the package ``poetlab_execute_<name>``.

    Both executors compared are loaded this way, the tree's too, rather than one imported and the other
    loaded: an imported module runs at another speed than the same code loaded, on these cold caches
    where code and objects lie matters."""
    package = f"poetlab_execute_{name}"
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory) / package
        root.mkdir()
        for file, source in sources.items():
            (root / file).write_text(source.replace("poetlab.torch.execute", package))
        sys.path.insert(0, directory)
        try:
            module = importlib.import_module(package)
        finally:
            sys.path.remove(directory)
    return module


def _rounds(runs: dict[str, object], compared: tuple[str, str], n: int) -> dict[str, list]:
    """Each of ``runs`` ``n`` times, in rounds that rotate their order, and swap the two ``compared``
    every other round, so that each of them follows the other as often as it is followed by it (a step
    runs faster after one that warmed the same model's data: 40-60 us on MobileNetV2 x2 for the second of
    two runs of one executor)."""
    samples: dict[str, list] = {name: [] for name in runs}
    first, second = compared
    for k in range(n):
        names = [name for name in runs if name not in compared] + ([first, second] if k % 2 == 0 else [second, first])
        shift = (k // 2) % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(runs[name]())
    return samples


def _parse_case(text: str) -> tuple[str, int, tuple[float, ...]]:
    try:
        name, batch, fractions = text.split(":")
        parsed = (name, int(batch), tuple(float(f) for f in fractions.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MODEL:BATCH:F1,F2 (e.g. mobilenetv2_torch:2:1.0,0.5)") from None
    if name not in TORCH_MODELS:
        raise argparse.ArgumentTypeError(f"unknown model {name!r}; choose from {', '.join(sorted(TORCH_MODELS))}")
    if parsed[1] < 1 or any(not 0.0 < f <= 1.0 for f in parsed[2]):
        raise argparse.ArgumentTypeError(f"{text!r}: the batch must be positive and each fraction in (0, 1]")
    return parsed


def run_case(base: ModuleType, new: ModuleType, name: str, batch_size: int, fractions, steps: int | None, time_limit_s: float, paging_dir: str, schedules: Path | None = None) -> list[dict[str, object]]:
    profile = profile_host(paging_dir, model=name, batch_size=batch_size, fuse=True, repeats=15, threads=1)
    model = build_torch_model(name, batch_size)
    graph = trace(model.module, model.inputs, model.loss_fn, model.targets, fuse=True, name=name)
    costs = poetlab.CostModel.from_profile(graph, profile)
    n_steps = steps or max(100, min(500, math.ceil(3.0 / profile.model.step_runtime_s)))
    rows = []
    for fraction in fractions:
        (budget,) = budget_ladder(graph, costs, [fraction])
        schedule, status, message = planned_schedule(graph, costs, budget, f"{name}-x{batch_size}-{fraction:g}-poet", "poet", time_limit_s, schedules)
        if schedule is None:
            rows.append({"model": name, "batch_size": batch_size, "budget_fraction": fraction, "status": status, "message": message})
            continue
        # One copy of the model for every kind of step: where a copy's tensors lie in memory moves a small
        # step by a few hundred microseconds (bench_execute.py's plain_control_vs_plain), which two copies
        # would add to the difference. The gradients are reset before each step; the steps run one after
        # the other.
        shared = copy.deepcopy(model.module)
        reference = copy.deepcopy(model.module)  # (for the first steps' gradients only)
        executors = {
            "base": base.ScheduleExecutor(shared, graph, schedule, model.loss_fn, paging_dir=paging_dir),
            "new": new.ScheduleExecutor(shared, graph, schedule, model.loss_fn, paging_dir=paging_dir),
        }
        rng = torch.get_rng_state()  # (the same random numbers for every first step: the encoder's dropout)
        _plain(reference, model.inputs, model.targets, model.loss_fn)
        grads_equal = {}
        for key, executor in executors.items():
            _drop_grads(shared)
            torch.set_rng_state(rng)
            executor.step(model.inputs, model.targets)
            grads_equal[key] = _same_grads(reference, shared)
        # (the nodes whose reruns replay random numbers: as the executor learnt in its first step)
        hand = HandStep(shared, graph, schedule, model.loss_fn, paging_dir=paging_dir, rng_nodes={i for i, draws in executors["new"].draws_rng.items() if draws})

        def executor_step(executor) -> float:
            _drop_grads(shared)
            start = time.thread_time()
            result = executor.step(model.inputs, model.targets)
            return time.thread_time() - start - getattr(result, "paging_cpu_s", 0.0)

        def hand_step() -> float:
            _drop_grads(shared)
            cpu, _, paging = hand.step(model.inputs, model.targets)
            return cpu - paging

        def plain_step() -> float:
            _drop_grads(shared)
            return _plain(shared, model.inputs, model.targets, model.loss_fn)[1]

        runs = {"plain": plain_step, "hand": hand_step, **{key: (lambda ex=ex: executor_step(ex)) for key, ex in executors.items()}}
        samples = {key: values[WARMUP:] for key, values in _rounds(runs, ("base", "new"), n_steps + WARMUP).items()}
        hand.close()
        plain_s, hand_s = statistics.median(samples["plain"]), statistics.median(samples["hand"])
        row = {
            "model": name,
            "batch_size": batch_size,
            "budget_fraction": fraction,
            "n_recomputes": schedule.n_recomputes,
            "n_pageouts": sum(op.kind is OpKind.PAGE_OUT for op in schedule.ops),
            "steps": n_steps,
            "base_grads_equal": grads_equal["base"],
            "new_grads_equal": grads_equal["new"],
            "median_plain_cpu_s": plain_s,
            "median_hand_step_cpu_s": hand_s,
            **{f"median_{key}_cpu_s": statistics.median(samples[key]) for key in executors},
            # the executors' own time beyond the hand step, over a plain step
            **{f"{key}_own_vs_hand_step": (statistics.median(samples[key]) - hand_s) / plain_s for key in executors},
            # this tree's step less the revision's, within each round
            "new_minus_base_s": statistics.median(n - b for n, b in zip(samples["new"], samples["base"], strict=True)),
        }
        rows.append(row)
        tqdm.write(
            f"{name} x{batch_size} @ {fraction:g}: own time beyond the hand step {row['base_own_vs_hand_step']:+.1%} (base) -> "
            f"{row['new_own_vs_hand_step']:+.1%} (this tree), {row['new_minus_base_s'] * 1e6:+.0f} us a step "
            f"(median of {n_steps} rounds; grads equal {grads_equal['base']}/{grads_equal['new']})"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision whose executor package is compared (e.g. HEAD~1)")
    parser.add_argument("--case", dest="cases", action="append", type=_parse_case, help=f"MODEL:BATCH:F1,F2 (repeatable; default {' '.join(CASES)})")
    parser.add_argument("--steps", type=int, default=None, help="rounds timed per budget (default: 3 s of plain steps, 100 to 500)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per MILP solve")
    parser.add_argument("--paging-dir", default=None, help="where the paging files go (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--schedules", type=Path, default=SCHEDULES, metavar="DIR", help="where each case's plan is kept and run again, as bench_execute.py's (default: data/schedules)")
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    cases = args.cases or [_parse_case(c) for c in CASES]
    revision = _git("rev-parse", "--verify", f"{args.base}^{{commit}}").strip()
    tree_changed = bool(_git("status", "--porcelain", "--", EXECUTOR).strip())
    base = load_executor(executor_sources(revision), "base")
    new = load_executor(executor_sources(None), "new")
    torch.set_num_threads(1)  # as profiled
    torch.use_deterministic_algorithms(True)
    retained = retain_freed_memory()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.paging_dir) as paging_dir:
        for name, batch_size, fractions in tqdm(cases, desc="executor A/B"):
            rows += run_case(base, new, name, batch_size, fractions, args.steps, args.time_limit, paging_dir, args.schedules)
    write_json_atomic(args.out, {
        "benchmark": "ab_execute",
        "base": revision,
        "this_tree": _git("rev-parse", "HEAD").strip() + (f" with {EXECUTOR} changed" if tree_changed else ""),
        "host": {"machine": host.machine(), "python": host.python_version(), "torch": torch.__version__, "threads": 1, "cpus": os.cpu_count(), "allocator_retains_freed_memory": retained},
        "rows": rows,
    })


if __name__ == "__main__":
    with planned_kernels():  # (every step on the executor's kernels: NOTE [kernel choice] in poetlab.torch.kernels)
        main()

"""Solve a grid into tidy rows: one row per (model, platform, runtime budget, memory budget, method),
the columns of :class:`poetlab.planners.comparison.ComparisonRow`. Every figure of the paper is drawn from such
rows; energy, runtime and peak always come from the simulator, and MILP rows carry their status and gap.

One engine runs every sweep: each budget of each case is a task (:class:`BudgetTask`), run on local
processes by default, or on a Dask cluster (``distributed``: a scheduler and its workers, on a laptop, a
Slurm allocation through dask-jobqueue, or any Dask deployment) when one is named: ``--cluster`` on the
command line, else ``$POETLAB_CLUSTER``, else ``cluster.address`` in ``params.yaml``. Rows come back in
the grid's order whatever ran them. On a cluster, Dask reruns the tasks of a worker that dies (and a task
that raises, up to :data:`RETRIES` times); a result is taken off the cluster as soon as it is finished,
so a later failure never recomputes it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from poetlab.core.costs import CostModel
from poetlab.core.paper_models import build_paper_graph
from poetlab.core.platforms import Platform, load_platform
from poetlab.errors import InvalidArgumentError, PoetlabError
from poetlab.planners.baselines import PlanOptions
from poetlab.planners.comparison import ComparisonRow, compare_methods
from poetlab.progress import progress_bar
from poetlab.reproduction.config import SweepConfig
from poetlab.reproduction.params import PARAMS_FILE, load_params

log = logging.getLogger(__name__)

COLUMNS: tuple[str, ...] = tuple(ComparisonRow.__dataclass_fields__)

#: Where a cluster is named when no ``--cluster`` is given.
CLUSTER_ENV = "POETLAB_CLUSTER"
#: A scheduler's address, ``tcp://HOST:PORT``, as ``dask scheduler`` prints it.
CLUSTER_ADDRESS = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")
#: Seconds to wait for the scheduler to answer, then for its first worker (a batch system may be slow to start one).
CONNECT_TIMEOUT_S = 5.0
WORKER_TIMEOUT_S = 120.0
#: Extra tries of a task that raised on a worker (a task whose worker died is rerun by Dask anyway).
RETRIES = 2


class ClusterError(PoetlabError, OSError):
    """A Dask cluster that cannot be reached or cannot run the sweep; the message says what to start."""


@dataclass(frozen=True)
class BudgetTask:
    """One budget of one case: every method of the sweep at one (model, platform, runtime budget, memory
    budget). The methods share a task because POET's MILP starts from the one-lever MILPs' schedules at the
    same budget; budgets are independent of each other (:func:`~poetlab.planners.comparison.budget_ladder`).
    The platform travels loaded, so that a worker needs poetlab but not the data folder."""

    model: str
    platform: Platform
    runtime_factor: float
    fraction: float
    methods: tuple[str, ...]
    batch_size: int
    options: PlanOptions


def budget_tasks(config: SweepConfig) -> list[BudgetTask]:
    """The sweep's tasks in the grid's order: case, runtime budget, memory budget."""
    options = PlanOptions(time_limit_s=config.time_limit_s, threads=config.threads, mip_gap=config.mip_gap)
    platforms = {name: _portable(load_platform(name)) for name in dict.fromkeys(p for _, p in config.cases)}
    return [
        BudgetTask(model, platforms[platform], factor, fraction, config.methods, config.batch_size, options)
        for model, platform in config.cases for factor in config.runtime_factors for fraction in config.fractions
    ]


def _portable(platform: Platform) -> Platform:
    """``platform`` with its read-only ``sources`` as a plain dict, so that it pickles to any process."""
    return replace(platform, sources=dict(platform.sources))


def solve_budget(task: BudgetTask) -> list[dict[str, object]]:
    """Every method of ``task`` at its budget, as dicts (one row each, in ``task.methods``' order)."""
    graph = build_paper_graph(task.model, task.batch_size)
    costs = CostModel.from_flops(graph, task.platform)
    rows = compare_methods(graph, costs, (task.fraction,), task.runtime_factor, task.methods, task.options)
    return [asdict(row) for row in rows]


def sweep(config: SweepConfig, cluster: str | None = None, params_file: str | os.PathLike[str] = PARAMS_FILE) -> pd.DataFrame:
    """Every method of ``config`` at every budget of every case, on the cluster that :func:`cluster_address`
    finds, else on ``config.workers`` local processes. Graphs and platforms are all built before the first
    solve, so a bad name fails at once."""
    for model in dict.fromkeys(m for m, _ in config.cases):
        build_paper_graph(model, config.batch_size)
    parts = run_tasks(solve_budget, budget_tasks(config), processes=config.workers, threads=config.threads,
                      cluster=cluster_address(cluster, params_file))
    return pd.DataFrame([row for part in parts for row in part], columns=list(COLUMNS))


def comparison_sweep(cases: Sequence[Sequence[str]], fractions: Sequence[float], runtime_factor: float, methods: Sequence[str],
                     time_limit_s: float, threads: int, batch_size: int = 1) -> SweepConfig:
    """The ``baselines`` stage's parameters (those of :func:`~poetlab.planners.comparison.comparison_table`)
    as a sweep, so that its planner calls run on the same engine as the figures' (in this process, or on
    the cluster when one is named), with the same rows in the same order."""
    return SweepConfig(cases=tuple((model, platform) for model, platform in cases), fractions=tuple(fractions),
                       runtime_factors=(runtime_factor,), methods=tuple(methods), time_limit_s=time_limit_s, threads=threads,
                       batch_size=batch_size)


def cluster_address(explicit: str | None = None, params_file: str | os.PathLike[str] = PARAMS_FILE) -> str | None:
    """The Dask scheduler to run on: ``explicit``, else ``$POETLAB_CLUSTER``, else ``cluster.address`` of
    ``params_file`` (when the file exists); None (local processes) when none is set. Checked for form only."""
    source, address = "--cluster", explicit
    if not address:
        source, address = CLUSTER_ENV, os.environ.get(CLUSTER_ENV, "").strip()
    if not address and Path(params_file).is_file():
        section = load_params(params_file).get("cluster") or {}
        source, address = f"{params_file}: cluster.address", section.get("address") if isinstance(section, dict) else section
    if not address:
        return None
    match = CLUSTER_ADDRESS.fullmatch(str(address).strip())
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise InvalidArgumentError(
            f"{source}: {address!r} is not a Dask scheduler address; give tcp://HOST:PORT as `dask scheduler` prints it "
            f"(e.g. tcp://127.0.0.1:8786), or leave it unset to solve on local processes"
        )
    return match.group(0)


def run_tasks(solve: Callable[[Any], Any], tasks: Sequence[Any], *, processes: int = 1, threads: int | None = None,
              cluster: str | None = None, desc: str = "sweep") -> list[Any]:
    """``[solve(t) for t in tasks]``, on the Dask scheduler at ``cluster`` or, without one, on ``processes``
    local processes (in this process when 1). ``threads``: solver threads each task uses, asked of Dask
    workers that offer a ``threads`` resource. ``solve`` must be importable by the workers."""
    if cluster:
        return _run_on_cluster(solve, tasks, cluster, threads, desc)
    if processes <= 1 or len(tasks) <= 1:
        log.info("%s: %d tasks in this process", desc, len(tasks))
        return [solve(task) for task in progress_bar(tasks, desc=desc, unit="task")]
    log.info("%s: %d tasks on %d local processes", desc, len(tasks), min(processes, len(tasks)))
    results: list[Any] = [None] * len(tasks)
    # spawned, not forked: the caller may be a Jupyter kernel with threads and signal handlers of its own
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(processes, len(tasks)), mp_context=context) as pool:
        futures = {pool.submit(solve, task): i for i, task in enumerate(tasks)}
        try:
            for future in progress_bar(as_completed(futures), desc=desc, unit="task", total=len(tasks)):
                results[futures[future]] = future.result()
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    return results


def _run_on_cluster(solve: Callable[[Any], Any], tasks: Sequence[Any], address: str, threads: int | None, desc: str) -> list[Any]:
    try:  # imported here: `import poetlab` and local sweeps never load dask
        from distributed import Client, KilledWorker
        from distributed import as_completed as completed
    except ImportError as exc:
        raise ClusterError(f"running on a Dask cluster needs dask and distributed; pip install -e '.[pipeline]' -c constraints.txt ({exc})") from exc

    try:
        client = Client(address, timeout=f"{CONNECT_TIMEOUT_S}s", set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise ClusterError(
            f"no Dask scheduler answers at {address} within {CONNECT_TIMEOUT_S:g} s; start one (`dask scheduler`) and its workers "
            f"(`dask worker {address}`), or unset --cluster / ${CLUSTER_ENV} / cluster.address to solve on local processes"
        ) from exc
    with client:
        try:
            client.wait_for_workers(1, timeout=WORKER_TIMEOUT_S)
        except TimeoutError as exc:
            raise ClusterError(f"the Dask scheduler at {address} has no worker after {WORKER_TIMEOUT_S:g} s; start some: dask worker {address}") from exc
        resources = _thread_resources(client, threads, address)
        workers = len(client.scheduler_info(n_workers=-1)["workers"])
        log.info("%s: %d tasks on the Dask cluster at %s (%d workers now)", desc, len(tasks), address, workers)
        pending = client.map(solve, tasks, pure=False, retries=RETRIES, resources=resources)
        order = {future.key: i for i, future in enumerate(pending)}
        finished = completed(pending, loop=client.loop, with_results=True)
        del pending  # from here on a finished task's only reference is the one released below
        results: list[Any] = [None] * len(tasks)
        try:
            for future, result in progress_bar(finished, desc=desc, unit="task", total=len(tasks)):
                results[order[future.key]] = result
                future.release()  # its result is here: the cluster forgets it and never recomputes it
        except KilledWorker as exc:
            raise ClusterError(f"a sweep task took down its Dask worker on every try ({exc}); give the workers more memory "
                               f"(dask worker --memory-limit) or fewer threads each") from exc
    return results


def _thread_resources(client: Any, threads: int | None, address: str) -> dict[str, int] | None:
    """``{"threads": threads}`` when the workers offer a ``threads`` resource (``dask worker --resources
    threads=N``: Dask then runs at most N solver threads at once on each), None when none does."""
    offered = [w.get("resources", {}).get("threads", 0) for w in client.scheduler_info(n_workers=-1)["workers"].values()]
    if not any(offered):
        return None
    need = threads or 1
    if max(offered) < need:
        raise ClusterError(f"the Dask workers at {address} offer at most {max(offered):g} threads but each solve uses {need}; "
                           f"start workers with --resources threads={need} or lower the stage's threads in params.yaml")
    return {"threads": need}


def read_rows(path) -> pd.DataFrame:
    """Rows written by a sweep stage (CSV), with the boolean column restored."""
    rows = pd.read_csv(path)
    rows["feasible"] = rows["feasible"].astype(bool)
    return rows

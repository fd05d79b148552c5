"""The sweep engine on a real Dask cluster (``distributed.LocalCluster``: a scheduler and two worker
processes on 127.0.0.1): the same rows as on local processes, in the same order, and a worker killed in
the middle of a task costs only that task, which Dask reruns; rows already back are never recomputed."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import cloudpickle
import pandas as pd
import pytest
from distributed import LocalCluster

from poetlab.cli import main
from poetlab.errors import InvalidArgumentError
from poetlab.reproduction.config import stage_config
from poetlab.reproduction.sweep import COLUMNS, ClusterError, budget_tasks, cluster_address, read_rows, run_tasks, solve_budget, sweep

#: Everything but the wall-clock solve time, which differs from run to run on any machine, and the MIP gap, which
#: :func:`_assert_same_rows` compares to within the gap at which a solve is certified.
COMPARED = [column for column in COLUMNS if column not in ("plan_time_s", "mip_gap")]
#: How long each task of the killing test holds its worker before solving: time to kill one mid-task.
HOLD_S = 1.0


@pytest.fixture(scope="module")
def cluster():
    loopback = dict(host="127.0.0.1", dashboard_address="127.0.0.1:0", worker_dashboard_address="127.0.0.1:0")  # nothing off this machine
    # each worker offers one solver thread, so Dask runs one solve at a time on each (the stage's threads: 1)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, resources={"threads": 1}, **loopback) as local:
        yield local


@pytest.fixture(autouse=True)
def _no_cluster_named(monkeypatch):
    monkeypatch.delenv("POETLAB_CLUSTER", raising=False)


def _rows(parts: list[list[dict[str, object]]]) -> pd.DataFrame:
    return pd.DataFrame([row for part in parts for row in part], columns=list(COLUMNS))


def _assert_same_rows(got: pd.DataFrame, expected: pd.DataFrame, mip_gap: float) -> None:
    """The same rows with the same schedules and metrics. A certified solve's reported gap is not repeatable (the
    same optimal row was reported at 1.3e-16 in one run and 9.9e-7 in another: a solve stops at the first bound
    within ``mip_gap`` it has), so gaps must agree only to within ``mip_gap``, and a gap on one side needs one on
    the other."""
    pd.testing.assert_frame_equal(got[COMPARED], expected[COMPARED])
    assert got.mip_gap.isna().equals(expected.mip_gap.isna())
    assert (got.mip_gap - expected.mip_gap).abs().fillna(0.0).le(mip_gap).all(), (list(got.mip_gap), list(expected.mip_gap))


def _without_gaps(value: object) -> object:
    """``value`` (a metrics JSON) with every "mip_gap" entry left out, for :func:`_assert_same_rows`'s reason."""
    if isinstance(value, dict):
        return {key: _without_gaps(item) for key, item in value.items() if key != "mip_gap"}
    return value


def test_the_smoke_sweep_on_a_cluster_gives_the_local_rows(cluster, tmp_path, capsys):
    """``poetlab sweep`` with and without ``--cluster``: the same rows in the same order, the same metrics."""
    assert main(["sweep", "fig4_runtime", "--preset", "smoke", "--out", str(tmp_path / "local")]) == 0
    assert main(["sweep", "fig4_runtime", "--preset", "smoke", "--cluster", cluster.scheduler_address, "--out", str(tmp_path / "remote")]) == 0
    printed = capsys.readouterr().out
    local, remote = (read_rows(tmp_path / where / "results" / "fig4_runtime.csv") for where in ("local", "remote"))
    assert f"{len(local)} rows from the Dask cluster at {cluster.scheduler_address}" in printed
    config = stage_config("fig4_runtime", "smoke")
    # the configured runtime factors, plus the points of each case's window (fig4_runtime.window_sweep)
    assert set(config.runtime_factors) <= set(local.runtime_budget_factor)
    assert len(local) >= len(config.cases) * len(config.runtime_factors) * len(config.fractions) * len(config.methods)
    assert "time_limit" not in set(local.status)  # certified (or proven infeasible): no time limit makes them differ
    _assert_same_rows(remote, local, config.mip_gap)
    metrics = [json.loads((tmp_path / where / "metrics" / "fig4_runtime.json").read_text()) for where in ("local", "remote")]
    assert _without_gaps(metrics[0]) == _without_gaps(metrics[1]) and metrics[0]["n_rows"] == len(local)


def test_a_cluster_without_the_threads_a_solve_uses_is_refused_before_any_task(cluster):
    with pytest.raises(ClusterError, match=r"offer at most 1 threads but each solve uses 2; start workers with --resources threads=2"):
        run_tasks(solve_budget, budget_tasks(stage_config("fig4_runtime", "smoke")), threads=2, cluster=cluster.scheduler_address)


def _held_solve(log_dir: Path, task):
    """:func:`solve_budget`, after holding the worker for :data:`HOLD_S`, leaving a file when it starts and
    one when it is done (which task, which worker process, when)."""
    name = f"{task.runtime_factor:g}x{task.fraction:g}"
    (log_dir / f"start {name} {os.getpid()} {uuid.uuid4().hex}").touch()
    time.sleep(HOLD_S)
    rows = solve_budget(task)
    (log_dir / f"done {name} {os.getpid()} {time.time():.6f}").touch()
    return rows


def _entries(log_dir: Path, kind: str) -> list[list[str]]:
    return [path.name.split()[1:] for path in log_dir.iterdir() if path.name.startswith(kind + " ")]


def test_a_worker_killed_mid_sweep_costs_only_its_task(cluster, tmp_path):
    config = replace(stage_config("fig4_runtime", "smoke"), runtime_factors=(1.0, 1.5, 2.0, 3.0), fractions=(0.3, 0.6), workers=1)
    tasks = budget_tasks(config)
    expected = _rows([solve_budget(task) for task in tasks])
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers need not import this test
    solve = functools.partial(_held_solve, tmp_path)
    with ThreadPoolExecutor(1) as runner:
        running = runner.submit(run_tasks, solve, tasks, threads=1, cluster=cluster.scheduler_address)
        deadline = time.monotonic() + 60
        victim = None
        while victim is None and time.monotonic() < deadline and not running.done():
            done = _entries(tmp_path, "done")
            started = _entries(tmp_path, "start")
            finished_by = {(name, pid) for name, pid, _ in done}
            busy = [pid for name, pid, _ in started if (name, pid) not in finished_by]
            if busy and any(float(at) < time.time() - 0.6 for _, _, at in done):  # a row back for a while
                victim = int(busy[0])
            else:
                time.sleep(0.05)
        assert victim is not None, "no task was in flight after a first one finished"
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        parts = running.result(timeout=120)
    _assert_same_rows(_rows(parts), expected, config.mip_gap)
    done = _entries(tmp_path, "done")
    started = _entries(tmp_path, "start")
    assert {name for name, _, _ in done} == {f"{t.runtime_factor:g}x{t.fraction:g}" for t in tasks}
    lost = [name for name, pid, _ in started if int(pid) == victim and not any(d[:2] == [name, pid] for d in done)]
    assert len(lost) == 1  # the victim died in the middle of one task
    assert sum(name == lost[0] for name, _, _ in started) == 2  # ... which another worker ran again
    back_before = [name for name, _, at in done if float(at) < killed_at - 0.5]
    assert back_before, "no row was back before the kill"
    for name in back_before:  # a row already back is never recomputed
        assert sum(d[0] == name for d in done) == 1, name


def test_a_bad_or_silent_cluster_is_one_line_naming_the_fix(tmp_path):
    config = stage_config("fig4_runtime", "smoke")
    with pytest.raises(InvalidArgumentError, match=r"tcp://HOST:PORT"):
        sweep(config, "localhost:8786")
    params = tmp_path / "params.yaml"
    params.write_text("presets: {}\ncluster:\n  address: tcp://127.0.0.1:8786\n")
    assert cluster_address(None, params) == "tcp://127.0.0.1:8786"
    params.write_text("presets: {}\ncluster:\n  address: 127.0.0.1\n")
    with pytest.raises(InvalidArgumentError, match=r"params.yaml: cluster.address: '127.0.0.1' is not a Dask scheduler address"):
        cluster_address(None, params)
    started = time.monotonic()
    with pytest.raises(ClusterError, match=r"no Dask scheduler answers at tcp://127\.0\.0\.1:1 .*dask scheduler"):
        sweep(config, "tcp://127.0.0.1:1")  # nothing listens on port 1
    assert time.monotonic() - started < 30

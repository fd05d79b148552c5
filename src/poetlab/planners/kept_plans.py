"""Plans kept on disk and run again: a time-limited MILP returns another schedule from run to run, and
runs that compare executors should run the same plans (the benchmarks keep theirs in ``data/schedules/``)."""

from __future__ import annotations

from pathlib import Path

from poetlab.core.schedule import Schedule, checkpoint_all_schedule, simulate
from poetlab.errors import InvalidArgumentError
from poetlab.planners.poet.solver import solve

#: ``planner`` of :func:`planned_schedule` for POET's paging-only arm (no recomputation)
PAGING_ONLY = "paging_only"


def planned_schedule(graph, costs, budget: float, key: str, planner: str, time_limit_s: float, schedules: Path | None, replan: bool = False) -> tuple[Schedule | None, str, str]:
    """(schedule, status, message) of one case: checkpoint-all at a budget of its peak or more (with the bytes
    :func:`poetlab.solve` keeps free, ``graph.reserved_bytes``), else POET's
    MILP (its paging-only arm for ``planner`` PAGING_ONLY) under ``time_limit_s``.

    With ``schedules`` (a folder; the benchmarks' is ``data/schedules``), the plan is kept there as
    ``KEY.json`` and read back on the next run (status ``loaded``; ``replan`` plans it again and keeps the
    new one): a time-limited MILP returns another schedule from run to run, and the executor's own time
    follows the schedule it runs, so runs that compare executors, from one stop to the
    next too, should run the same plans. A kept plan must still fit the budget on this run's graph; one kept
    before schedule files recorded their graph's fingerprint gets it written in once it replays on this graph
    within the budget, so that from then on loading it for another graph is refused."""
    if budget >= simulate(checkpoint_all_schedule(graph), graph, costs).peak_ram_bytes + graph.reserved_bytes:  # (as solve counts)
        return checkpoint_all_schedule(graph), "checkpoint_all", ""
    path = schedules / f"{key}.json" if schedules is not None else None
    if path is not None and path.exists() and not replan:
        schedule = Schedule.load(path, graph)
        if schedule.n_nodes != graph.n_nodes or simulate(schedule, graph, costs).peak_ram_bytes + graph.reserved_bytes > budget:
            raise InvalidArgumentError(f"{path}: planned for another graph or budget; delete it to plan this case again")
        if schedule.graph_fingerprint is None:  # kept before files recorded their graph: record it now that it replays
            schedule.save(path, graph)
            return schedule, "loaded", f"from {path} (its graph's fingerprint recorded)"
        return schedule, "loaded", f"from {path}"
    solved = solve(graph, costs, budget, time_limit_s=time_limit_s, remat=planner != PAGING_ONLY)
    if solved.schedule is not None and path is not None:
        solved.schedule.save(path, graph)
    return solved.schedule, solved.status, solved.message

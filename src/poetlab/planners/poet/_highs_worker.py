"""The HiGHS child process, run as a script in isolated mode: ``python -I path/to/_highs_worker.py``.

It imports numpy and highspy only, never poetlab (whose package would pull its dependencies into every
solve) and never the current directory (``-I``: no script directory, working directory or
``PYTHONPATH`` on ``sys.path``, so a folder named like a package cannot stand in for it).

Reads one pickled request (a dict of plain numpy arrays and numbers, see ``request`` in
:func:`poetlab.planners.poet.backends._solve_highs`) and streams its messages through ``_worker_io.py`` (loaded by
path; it also ends the worker with its parent): ('incumbent', objective, x) for each improving solution, ('bound',
dual bound) at most twice a second while the MIP runs (so that a worker killed past its time limit has
still told its bound), and ('done', status, objective, bound, x) at the end.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    spec = importlib.util.spec_from_file_location("_worker_io", Path(__file__).with_name("_worker_io.py"))  # (by path: -I)
    io = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(io)
    request, messages = io.begin(argv)
    import highspy
    import numpy as np

    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(request["verbose"]))
    h.setOptionValue("time_limit", float(request["time_limit_s"]))
    h.setOptionValue("mip_rel_gap", float(request["mip_gap"]))
    h.setOptionValue("mip_abs_gap", 0.0)  # the relative gap alone decides (the objective arrives scaled near 1)
    h.setOptionValue("random_seed", 0)
    for name, value in request.get("options", {}).items():
        h.setOptionValue(name, value)
    if request["threads"]:
        h.setOptionValue("threads", int(request["threads"]))
    n_cols, n_rows = len(request["c"]), len(request["row_lower"])
    lp = highspy.HighsLp()
    lp.num_col_ = n_cols
    lp.num_row_ = n_rows
    lp.col_cost_ = request["c"]
    lp.col_lower_ = request["col_lower"]
    lp.col_upper_ = request["col_upper"]
    lp.row_lower_ = np.where(np.isfinite(request["row_lower"]), request["row_lower"], -highspy.kHighsInf)
    lp.row_upper_ = np.where(np.isfinite(request["row_upper"]), request["row_upper"], highspy.kHighsInf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = request["A_csc"]
    lp.integrality_ = [highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous for flag in request["integer"]]
    h.passModel(lp)
    start = request["start"]
    if start is not None:
        h.setSolution(len(start), np.arange(len(start), dtype=np.int32), np.asarray(start, dtype=np.float64))

    def on_improving(event) -> None:
        io.send(messages, ("incumbent", float(event.data_out.objective_function_value), np.array(event.data_out.mip_solution)))

    h.cbMipImprovingSolution.subscribe(on_improving)
    reported = [-1.0]

    def on_progress(event) -> None:
        bound, now = float(event.data_out.mip_dual_bound), float(event.data_out.running_time)
        if np.isfinite(bound) and now - reported[0] >= 0.5:
            reported[0] = now
            io.send(messages, ("bound", bound))

    h.cbMipInterrupt.subscribe(on_progress)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    S = highspy.HighsModelStatus
    has = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    x = np.array(h.getSolution().col_value) if has else None
    objective = float(info.objective_function_value) if has else None
    bound = float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else None
    names = {S.kOptimal: "optimal", S.kInfeasible: "infeasible", S.kTimeLimit: "time_limit"}
    name = names.get(status, "feasible" if has else f"error: {h.modelStatusToString(status)}")
    io.send(messages, ("done", name, objective, bound, x))
    messages.close()


if __name__ == "__main__":
    main(sys.argv[1:])

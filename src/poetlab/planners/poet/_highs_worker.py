"""The HiGHS child process (``python -m poetlab.planners.poet._highs_worker``).

Reads one pickled request on stdin: (MilpModel, time_limit_s, mip_gap, threads, verbose, start), where
start is a feasible solution vector (a MIP start) or None. Writes
length-prefixed pickled messages on the file descriptor that was stdout: ('incumbent', objective, x)
for each improving solution and ('done', status, objective, bound, x) at the end. HiGHS's own console
output goes to stderr, so it can never corrupt the message stream.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys

import numpy as np


def _send(stream, message: tuple) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(payload)) + payload)
    stream.flush()


def main() -> None:
    request = pickle.load(sys.stdin.buffer)
    messages = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed from here on (HiGHS's log) goes to stderr
    model, time_limit_s, mip_gap, threads, verbose, start = request

    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(verbose))
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", float(mip_gap))
    h.setOptionValue("random_seed", 0)
    if threads:
        h.setOptionValue("threads", int(threads))
    A = model.A.tocsc()
    lp = highspy.HighsLp()
    lp.num_col_ = model.n_cols
    lp.num_row_ = model.n_rows
    lp.col_cost_ = model.c
    lp.col_lower_ = model.col_lower
    lp.col_upper_ = model.col_upper
    lp.row_lower_ = np.where(np.isfinite(model.row_lower), model.row_lower, -highspy.kHighsInf)
    lp.row_upper_ = np.where(np.isfinite(model.row_upper), model.row_upper, highspy.kHighsInf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr
    lp.a_matrix_.index_ = A.indices
    lp.a_matrix_.value_ = A.data
    lp.integrality_ = [highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous for flag in model.integer]
    h.passModel(lp)
    if start is not None:
        h.setSolution(len(start), np.arange(len(start), dtype=np.int32), np.asarray(start, dtype=np.float64))

    def on_improving(event) -> None:
        _send(messages, ("incumbent", float(event.data_out.objective_function_value), np.array(event.data_out.mip_solution)))

    h.cbMipImprovingSolution.subscribe(on_improving)
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
    _send(messages, ("done", name, objective, bound, x))
    messages.close()


if __name__ == "__main__":
    main()

"""POET: the MILP (:mod:`~poetlab.planners.poet.milp`, built once as sparse matrices), its solver backends
(:mod:`~poetlab.planners.poet.backends`: HiGHS in a child process, Gurobi) and
:func:`~poetlab.planners.poet.solver.solve`, which warm-starts the MILP from the quick planners and replays
its answer through the simulator.
"""

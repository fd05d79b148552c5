"""Everything that turns a graph, its costs and budgets into a :class:`~poetlab.core.schedule.Schedule`:
:mod:`~poetlab.planners.poet` (the POET MILP, its backends and warm starts), :mod:`~poetlab.planners.baselines`
(one module per published method), :mod:`~poetlab.planners.heuristics` (the greedy schedules both use) and
:mod:`~poetlab.planners.comparison` (every method on one simulator, as tidy rows).
"""

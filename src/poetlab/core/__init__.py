"""The kit's nouns, in numpy alone (no torch, no planner, no technique): a :class:`~poetlab.core.graph.TrainingGraph`,
a :class:`~poetlab.core.platforms.Platform`, the :class:`~poetlab.core.costs.CostModel` they give, the paper's
models as layer lists, the one :class:`~poetlab.core.schedule.Schedule` format every planner emits and the
simulator that checks and costs it. Everything else in poetlab builds on these; they build on nothing else.
"""

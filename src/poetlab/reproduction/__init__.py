"""The paper's figures and tables, one module each, and the checks of the pipeline's parameters.

- :mod:`~poetlab.reproduction.config`: each stage's parameters, validated before any work is done;
- :mod:`~poetlab.reproduction.sweep`: solve a grid (model x platform x memory budget x runtime budget x
  method) into tidy rows, the input of every figure;
- :mod:`~poetlab.reproduction.table2_platforms`: the platforms and the sources of their coefficients;
- :mod:`~poetlab.reproduction.fig3_frontier`: energy of one training step against peak memory;
- :mod:`~poetlab.reproduction.fig4_runtime`: energy across runtime budgets, POET against its two levers;
- :mod:`~poetlab.reproduction.fig5_capuchin`: POET against Capuchin as the RAM budget shrinks;
- :mod:`~poetlab.reproduction.table3_pofo`: POET against POFO, peak memory and throughput;
- :mod:`~poetlab.reproduction.feasibility`: the smallest memory in which each model trains, and the
  train-vs-inference memory ratio;
- :mod:`~poetlab.reproduction.claims`: each claim of the paper beside our number;
- :mod:`~poetlab.reproduction.report`: ``experiments/report.md``.
- :mod:`~poetlab.reproduction.techniques_frontier` (not in the paper): POET, POET with compression and
  sparse update on one conv chain, memory against energy.
- :mod:`~poetlab.reproduction.launcher`: how a stage runs its notebook so that papermill and its kernel die
  with ``dvc repro`` (``python -m poetlab.reproduction run STAGE ...``).

Each figure module reads tidy rows and returns a matplotlib figure or a DataFrame; the notebooks under
``notebooks/`` only wire them together (``python -m poetlab.reproduction check STAGE PRESET`` checks a
stage's parameters in one line before its notebook runs).
"""

"""The schedules POET starts from: the quick planners' schedules (greedy paging, the eviction bound's covers,
DTR, greedy remat, Capuchin), the cheapest of them that replays within the budgets, and those of them that are
solutions of POET's MILP. :func:`poetlab.planners.poet.solver.solve` starts every phase from the best schedule
found so far (:func:`better`), so that a solve stopped by its time limit is never worse than any start.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from poetlab.core.schedule import InvalidScheduleError, Schedule, SimulationResult
from poetlab.planners.heuristics import greedy_paging_schedule, greedy_remat_schedule
from poetlab.planners.poet.bounds import cover_schedules
from poetlab.planners.poet.milp import MilpOptions
from poetlab.planners.poet.neighbourhood import fits_milp, milp_form

log = logging.getLogger("poetlab.poet_solver")  # (the solver's logger: the starts are a step of its log)

#: the quick schedules that start the MILP (:func:`best_start`), by the names ``exclude_starts`` takes
QUICK_STARTS = ("greedy_paging", "eviction_cover", "dtr", "greedy_remat", "capuchin")


def best_start(
    graph, costs, options: MilpOptions, runtime_budget_s, replay, covers_s: float = 2.0, deadline: float = math.inf, exclude: Sequence[str] = (),
    collect: list | None = None, rejected: list | None = None, energies: dict[str, float] | None = None,
) -> tuple[Schedule | None, SimulationResult | None]:
    """The cheapest of the quick schedules that the options allow and that replay within the budgets,
    or (None, None): greedy paging, the eviction bound's covers made into schedules, the dynamic planner
    DTR and greedy remat (remat), Capuchin (remat and paging). Each takes milliseconds to a second and
    they are often close to the optimum at tight budgets, where HiGHS can spend its whole time limit
    before finding anything as good. Past ``deadline`` (the solve's time limit) the rest are skipped
    once one start exists. The methods stay independent baselines in the comparison too. Those named in
    ``exclude`` (:data:`QUICK_STARTS`) are skipped; every start that replays is appended to ``collect`` (with
    its simulation) where one is given, and every one that does not to ``rejected``; ``energies`` gets each start's least
    energy that replays within the budgets, by name (e.g. "eviction cover")."""
    # the baselines import poetlab.solve for their MILP variants, so they are imported here, not above
    from poetlab.planners.baselines import capuchin, dtr
    from poetlab.planners.baselines.base import Budgets, CannotMeetBudget

    budget = options.ram_budget_bytes - (2 * graph.param_bytes if options.params_in_budget else 0)
    budgets = Budgets(budget, options.runtime_budget_factor)
    candidates = []
    if options.paging:
        candidates.append(("greedy paging", lambda: [greedy_paging_schedule(graph, costs, budget, prefetch=options.charge_pagein)]))
    if covers_s > 0:  # the eviction bound's choices made into schedules (:func:`poetlab.planners.poet.bounds.cover_schedules`), each solved within covers_s
        candidates.append(("eviction cover", lambda: cover_schedules(graph, costs, options, covers_s)))
    if options.remat:
        candidates.append(("DTR", lambda: [dtr.plan(graph, costs, budgets)]))
        candidates.append(("greedy remat", lambda: [greedy_remat_schedule(graph, costs, budget, runtime_budget_s)]))
    if options.remat and options.paging:
        candidates.append(("Capuchin", lambda: [capuchin.plan(graph, costs, budgets)]))
    best: tuple[Schedule | None, SimulationResult | None] = (None, None)
    for name, make in candidates:
        if name.lower().replace(" ", "_") in exclude:
            log.info("the %s start is left out (exclude_starts)", name)
            continue
        if best[0] is not None and time.perf_counter() > deadline:
            log.info("time limit reached: the %s start and those after it are skipped", name)
            break
        try:
            made = make()
        except CannotMeetBudget:
            continue
        for schedule in made:
            fits: list = []
            best = better(best, name, schedule, replay, fits, rejected)
            if fits and energies is not None:
                energies[name] = min(energies.get(name, math.inf), fits[0][1].energy_j)
            if collect is not None:
                collect.extend(fits)
    return best


def milp_seeds(graph, model, fitting, replay, prefetch: bool) -> list[tuple[Schedule, SimulationResult]]:
    """Those of ``fitting`` (schedules with their simulations, all within the budgets) that are solutions
    of POET's MILP ``model`` as they are, cheapest first, then those that are in their MILP form
    (:func:`~poetlab.planners.poet.neighbourhood.milp_form`, replayed again), cheapest first; distinct
    energies only. (The window search tries them in this order: on Fig. 4's case DTR's schedule, the
    cheapest start but one made for the simulator's accounting, is a local optimum of the windows 2.9%
    above the bound, and greedy remat's, 1.4% dearer, leads to the optimum: docs/solve.md, NOTE 4.)"""
    native: list[tuple[Schedule, SimulationResult]] = []
    moved: list[tuple[Schedule, SimulationResult]] = []
    for schedule, sim in sorted(fitting, key=lambda pair: pair[1].energy_j):
        if any(abs(sim.energy_j - other.energy_j) <= 1e-12 * sim.energy_j for _, other in native + moved):
            continue
        if fits_milp(model, schedule):
            native.append((schedule, sim))
            continue
        form = milp_form(graph, schedule, prefetch)
        if fits_milp(model, form):
            try:
                moved.append((form, replay(form)))
            except InvalidScheduleError:
                continue
    return native + moved


def better(best, name: str, schedule: Schedule | None, replay, collect: list | None = None, rejected: list | None = None) -> tuple[Schedule | None, SimulationResult | None]:
    """``best`` or ``schedule``, whichever replays within the budgets at the lower energy (``schedule``
    appended to ``collect``, with its simulation, if it replays, else to ``rejected``)."""
    if schedule is None:
        return best
    try:
        sim = replay(schedule)
    except InvalidScheduleError as exc:
        log.info("%s start does not replay (%s)", name, exc)
        if rejected is not None:
            rejected.append(schedule)
        return best
    log.info("%s start: %.10g J (%d recomputes, %d page-outs)", name, sim.energy_j, sim.n_recomputes, sim.n_pageouts)
    if collect is not None:
        collect.append((schedule, sim))
    return (schedule, sim) if best[1] is None or sim.energy_j < best[1].energy_j else best

"""The schedules POET starts from: the cheapest quick start that fits, the ones that do not kept for the
repair, the names that leave a start out, and the starts that are solutions of POET's MILP."""

from __future__ import annotations

import pytest

from poetlab.core.schedule import InvalidScheduleError, checkpoint_all_schedule
from poetlab.planners.poet.milp import build_milp
from poetlab.planners.poet.neighbourhood import fits_milp
from poetlab.planners.poet.starts import QUICK_STARTS, best_start, better, milp_seeds

from small_graphs import convnet
from solve_checks import grid_instance


@pytest.fixture(scope="module")
def tight():
    """The small convnet on the M4 at a fifth of the way from its smallest footprint, runtime 1.2x."""
    return grid_instance(convnet(), "m4", 0.2, 1.2)


def test_the_best_start_is_the_cheapest_that_fits_and_the_others_are_sorted_out(tight):
    graph, costs, options, replay, budgets = tight
    fitting, rejected = [], []
    schedule, sim = best_start(graph, costs, options, budgets.runtime_s, replay, collect=fitting, rejected=rejected)
    assert fitting and schedule is not None
    assert sim.energy_j == min(other.energy_j for _, other in fitting)
    assert replay(schedule).energy_j == sim.energy_j
    for made, _ in fitting:
        assert replay(made).peak_ram_bytes <= options.ram_budget_bytes
    for made in rejected:
        with pytest.raises(InvalidScheduleError):
            replay(made)


def test_each_start_s_least_energy_within_the_budgets_is_kept_by_name(tight):
    """``energies``: per quick start that fits, its least energy (what the primal phase reads of the eviction cover's
    schedule, NOTE 18); the cheapest of them is the best start, and a start left out has none."""
    graph, costs, options, replay, budgets = tight
    energies, fitting = {}, []
    _, sim = best_start(graph, costs, options, budgets.runtime_s, replay, collect=fitting, energies=energies)
    assert energies and set(energies) <= {"greedy paging", "eviction cover", "DTR", "greedy remat", "Capuchin"}
    assert min(energies.values()) == sim.energy_j
    assert all(any(other.energy_j == energy for _, other in fitting) for energy in energies.values())
    left_out = {}
    best_start(graph, costs, options, budgets.runtime_s, replay, exclude=("eviction_cover",), energies=left_out)
    assert "eviction cover" not in left_out and "eviction cover" in energies


def test_every_start_left_out_by_name_is_left_out(tight, caplog):
    graph, costs, options, replay, budgets = tight
    with caplog.at_level("INFO", logger="poetlab.poet_solver"):
        best_start(graph, costs, options, budgets.runtime_s, replay, exclude=QUICK_STARTS)
    messages = [record.getMessage() for record in caplog.records]
    assert len([message for message in messages if "left out" in message]) == len(QUICK_STARTS)
    assert not any(" start: " in message for message in messages)  # (no start was made: "<name> start: <energy> J ...")


def test_better_keeps_the_cheaper_and_files_a_schedule_that_does_not_fit(tight):
    graph, costs, options, replay, budgets = tight
    best = best_start(graph, costs, options, budgets.runtime_s, replay)
    fitting, rejected = [], []
    over = checkpoint_all_schedule(graph)  # (the budget is below its peak)
    assert better(best, "checkpoint-all", over, replay, collect=fitting, rejected=rejected) == best
    assert rejected == [over] and fitting == []
    assert better(best, "nothing", None, replay) == best
    assert better((None, None), "the best", best[0], replay, collect=fitting)[1].energy_j == best[1].energy_j
    assert len(fitting) == 1


def test_milp_seeds_are_solutions_of_the_milp_cheapest_first(tight):
    graph, costs, options, replay, budgets = tight
    fitting = []
    best_start(graph, costs, options, budgets.runtime_s, replay, collect=fitting)
    model = build_milp(graph, costs, options)
    seeds = milp_seeds(graph, model, fitting, replay, prefetch=False)
    assert seeds
    assert all(fits_milp(model, schedule) for schedule, _ in seeds)
    energies = [sim.energy_j for _, sim in seeds]
    assert len(set(energies)) == len(energies)
    native = [sim.energy_j for schedule, sim in seeds if any(schedule is made for made, _ in fitting)]
    assert native == sorted(native)

"""Your own models in the pipeline: each file of ``params.yaml``'s ``user_models`` list
(``path/to/file.py:FUNCTION``, :mod:`poetlab.torch.user_models`) traced, planned by POET at memory budgets
from its smallest footprint (fraction 0) to checkpoint-all's peak (1), and executed for real at the
tightest budget that POET met: the same training steps plainly and under the schedule
(:func:`poetlab.torch.finetune.compare_training`), so the stage checks what a user relies on, gradients
unchanged and the measured peak inside the budget, not only what the simulator predicts.

Budgets are the user's RAM (:func:`poetlab.planners.comparison.budget_ladder`): the simulator and the planner
count each operation's workspace while it runs, and the RNG states kept for dropout's reruns, so the executed
peak is compared with the whole budget."""

from __future__ import annotations

import pandas as pd
import torch

from poetlab.core.costs import CostModel
from poetlab.core.platforms import load_platform
from poetlab.planners.comparison import budget_ladder
from poetlab.planners.poet.solver import solve
from poetlab.reproduction.config import UserModelsConfig
from poetlab.torch.finetune import compare_training
from poetlab.torch.trace import trace
from poetlab.torch.user_models import load_user_model, user_model_name


def user_model_tables(config: UserModelsConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(frontier, checks): one frontier row per (model, budget fraction) with POET's energy over one plain
    step, and one check row per model: the executed steps at its tightest feasible budget."""
    frontier, checks = [], []
    platform = load_platform(config.platform)
    for spec in config.models:
        model = load_user_model(spec)
        name = user_model_name(spec)
        graph = trace(model.module, model.inputs, model.loss_fn, model.targets, fuse=config.fuse, name=name)
        costs = CostModel.from_flops(graph, platform)
        tightest = None
        for fraction, budget in sorted(zip(config.fractions, budget_ladder(graph, costs, config.fractions), strict=True), reverse=True):
            result = solve(graph, costs, budget, time_limit_s=config.time_limit_s, mip_gap=config.mip_gap, threads=config.threads, solver=config.solver)
            feasible = result.schedule is not None
            frontier.append({
                "model": name, "spec": spec, "platform": config.platform, "budget_fraction": fraction, "ram_budget_bytes": budget,
                "workspace_bytes": graph.workspace_bytes, "feasible": feasible, "status": result.status,
                "energy_over_plain": result.energy_j / costs.plain_step_energy_j if feasible else None,
                "peak_ram_bytes": result.peak_ram_bytes, "n_recomputes": result.n_recomputes, "n_pageouts": result.n_pageouts,
                "mip_gap": result.mip_gap,
            })
            if feasible:
                tightest = (fraction, budget, result)
        if tightest is None:
            checks.append({"model": name, "budget_fraction": None, "ram_budget_bytes": None, "steps": 0, "identical": None,
                           "measured_peak_bytes": None, "within_budget": None, "n_recomputes": None, "n_pageouts": None})
            continue
        fraction, budget, result = tightest
        compared = compare_training(
            model.module, graph, result.schedule, model.loss_fn, [(model.inputs, model.targets)] * config.steps,
            lambda params: torch.optim.SGD(params, lr=0.01),
        )
        peak = max(compared.scheduled_peak_bytes)
        checks.append({
            "model": name, "budget_fraction": fraction, "ram_budget_bytes": budget, "steps": config.steps,
            "identical": compared.identical, "measured_peak_bytes": peak, "within_budget": peak <= budget,
            "n_recomputes": compared.n_recomputes, "n_pageouts": compared.n_pageouts,
        })
    return pd.DataFrame(frontier), pd.DataFrame(checks)


def user_model_metrics(frontier: pd.DataFrame, checks: pd.DataFrame) -> dict[str, object]:
    """Per model: budgets solved and feasible, the energy over one plain step at the tightest feasible
    budget, and the executed check (losses and parameters identical, measured peak within budget)."""
    out: dict[str, object] = {"n_models": int(len(checks))}
    for _, check in checks.iterrows():
        mine = frontier[frontier.model == check.model]
        feasible = mine[mine.feasible]
        out[check.model] = {
            "n_budgets": int(len(mine)), "n_feasible": int(len(feasible)),
            "energy_over_plain_at_tightest": None if feasible.empty else float(feasible.energy_over_plain.iloc[-1]),
            "identical": None if pd.isna(check.identical) else bool(check.identical),  # (iterrows makes None NaN)
            "within_budget": None if pd.isna(check.within_budget) else bool(check.within_budget),
            "measured_peak_bytes": None if pd.isna(check.measured_peak_bytes) else int(check.measured_peak_bytes),
            "ram_budget_bytes": None if pd.isna(check.ram_budget_bytes) else float(check.ram_budget_bytes),
            "moved_tensors": None if pd.isna(check.n_recomputes) else int(check.n_recomputes + check.n_pageouts),
        }
    out["all_identical_and_within_budget"] = bool(len(checks)) and bool(checks.identical.fillna(False).all() and checks.within_budget.fillna(False).all())
    return out


def user_model_figure(frontier: pd.DataFrame):
    """Energy over one plain step against the RAM budget, one line per model."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for (name, mine), marker in zip(frontier.groupby("model", sort=False), "osD^v<>ph*"):
        feasible = mine[mine.feasible]
        ax.plot(feasible.ram_budget_bytes / 1e6, feasible.energy_over_plain, marker=marker, label=name)
    ax.set_xlabel("RAM budget (MB, workspace included)")
    ax.set_ylabel("energy / one plain step")
    ax.set_title("POET on your own models")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def user_model_summary(metrics: dict[str, object]) -> str:
    """One sentence per model from the metrics (the notebook's closing text)."""
    lines = []
    for name, m in metrics.items():
        if not isinstance(m, dict):
            continue
        if m["identical"] is None:
            lines.append(f"- {name}: no budget of the grid was feasible.")
            continue
        verdict = "identical to plain PyTorch" if m["identical"] else "NOT identical to plain PyTorch"
        fits = "within" if m["within_budget"] else "OVER"
        lines.append(
            f"- {name}: at its tightest feasible budget ({m['ram_budget_bytes']:,.0f} B) POET costs {m['energy_over_plain_at_tightest']:.4f}x a plain step; "
            f"executed with {m['moved_tensors']} recomputes and page-outs a step, losses and parameters {verdict}, measured peak "
            f"{m['measured_peak_bytes']:,} B, {fits} the budget."
        )
    return "\n".join(lines)

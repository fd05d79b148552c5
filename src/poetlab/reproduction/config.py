"""Each reproduction stage's parameters (``params.yaml``, ``presets.<preset>.<stage>``), checked in full
before any work starts: an unknown model or platform, an empty budget grid or a value out of range stops
the stage with one line that names the key, e.g. ``presets.default.fig3_frontier.platforms``.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from poetlab.planners.baselines.milp_variants import MILP_VARIANTS
from poetlab.planners.comparison import METHODS
from poetlab.errors import InvalidArgumentError
from poetlab.core.paper_models import MAX_BATCH_SIZE, PAPER_MODELS
from poetlab.reproduction.params import PARAMS_FILE, active_preset, stage_params
from poetlab.core.platforms import HOST, available_platforms


@dataclass(frozen=True)
class PlatformTableConfig:
    platforms: tuple[str, ...]


@dataclass(frozen=True)
class SweepConfig:
    """A grid of solves: every (model, platform) case at every memory-budget fraction (0: the smallest
    single-node footprint, 1: checkpoint-all's peak) and every runtime budget (a factor of one plain
    step), by every method. ``workers`` budgets are solved at once on local processes, or as many as a
    Dask cluster's workers take when one is named (:mod:`poetlab.reproduction.sweep`); each solve uses
    ``threads`` solver threads."""

    cases: tuple[tuple[str, str], ...]
    fractions: tuple[float, ...]
    runtime_factors: tuple[float, ...]
    methods: tuple[str, ...]
    time_limit_s: float
    threads: int
    batch_size: int
    workers: int = 1
    mip_gap: float = 1e-4  # a MILP solve within it of its bound is certified optimal
    #: Fig. 4 only: runtime factors sampled in each case's window (1, t), t the smallest factor at which
    #: remat only is feasible, as 1 + p (t - 1) for each p (p > 1: just above t)
    remat_window_points: tuple[float, ...] = ()


@dataclass(frozen=True)
class FeasibilityConfig:
    models: tuple[str, ...]
    platforms: tuple[str, ...]
    batch_size: int


@dataclass(frozen=True)
class ClaimsConfig:
    """``gap_tolerance``: how much above another method POET may be when its MILP stopped at its time
    limit, beyond its own reported gap, before a claim that POET is cheaper counts as not reproduced."""

    gap_tolerance: float


@dataclass(frozen=True)
class ReportConfig:
    title: str


@dataclass(frozen=True)
class TechniquesFrontierConfig:
    """The frontier of POET, POET+compression and sparse update on one conv chain
    (:func:`poetlab.core.paper_models.conv_chain_graph`, with autograd's saved tensors): every ReLU output at
    ``relu_density`` (``density_margin`` added for safety), sparse update under ``sparse_scheme`` (the
    syntax of :func:`poetlab.techniques.sparse_update.parse_scheme`: full, bias-only, last-K, sparse), memory budgets as fractions from the smallest footprint (0) to checkpoint-all (1)."""

    channels: int
    side: int
    depth: int
    platform: str
    relu_density: float
    density_margin: float
    sparse_scheme: str
    fractions: tuple[float, ...]
    runtime_factor: float
    time_limit_s: float
    mip_gap: float
    threads: int
    solver: str


@dataclass(frozen=True)
class UserModelsConfig:
    """Your own models (``path/to/file.py:FUNCTION``, relative to the repository) planned by POET at memory
    budgets as fractions from the smallest footprint (0) to checkpoint-all (1), workspace added, on
    ``platform``, and executed ``steps`` steps at the tightest feasible one."""

    models: tuple[str, ...]
    fuse: bool
    platform: str
    fractions: tuple[float, ...]
    steps: int
    time_limit_s: float
    mip_gap: float
    threads: int
    solver: str


@dataclass(frozen=True)
class TinyTrainingConfig:
    """Tiny Training's peak memory: ``model`` (a torch model of :mod:`poetlab.torch.models`) under full
    update and ``sparse_scheme`` (full, bias-only, sparse, last-K), each without and with reordering."""

    model: str
    sparse_scheme: str
    batch_size: int
    seed: int


@dataclass(frozen=True)
class BitTrainConfig:
    """BitTrain on a DigitsCNN (``width`` channels, ``depth`` conv blocks) trained on the digits with
    SGD at ``lr``, measured after each of ``checkpoints`` steps."""

    width: int
    depth: int
    batch_size: int
    checkpoints: tuple[int, ...]
    lr: float
    seed: int


class _Section:
    """Reads one stage's section and names the exact key in every error."""

    def __init__(self, stage: str, preset: str, values: Mapping[str, Any], path: str):
        self.stage, self.preset, self.values, self.path = stage, preset, values, path

    def key(self, name: str) -> str:
        return f"presets.{self.preset}.{self.stage}.{name}"

    def fail(self, name: str, problem: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{self.path}: {self.key(name)} {problem}")

    def get(self, name: str) -> Any:
        if name not in self.values:
            raise self.fail(name, "is missing; add it (see the other presets)")
        return self.values[name]

    def names(self, name: str, valid: Sequence[str], kind: str) -> tuple[str, ...]:
        values = self.get(name)
        if isinstance(values, str) or not isinstance(values, Sequence) or not values:
            raise self.fail(name, f"must be a non-empty list of {kind}s; valid {kind}s: {', '.join(valid)}")
        for value in values:
            if value not in valid:
                raise self.fail(name, f"has unknown {kind} {value!r}; valid {kind}s: {', '.join(valid)}")
        if len(set(values)) != len(values):
            raise self.fail(name, f"lists a {kind} twice; list each once")
        return tuple(values)

    def name(self, name: str, valid: Sequence[str], kind: str) -> str:
        value = self.get(name)
        if value not in valid:
            raise self.fail(name, f"is an unknown {kind} {value!r}; valid {kind}s: {', '.join(valid)}")
        return value

    def number(self, name: str, low: float, high: float = math.inf, integer: bool = False) -> float:
        value = self.get(name)
        kind = numbers.Integral if integer else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind) or not (math.isfinite(value) and low <= value <= high):
            span = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
            raise self.fail(name, f"must be a finite {'integer' if integer else 'number'} {span}, got {value!r}")
        return value

    def grid(self, name: str, low: float, high: float = math.inf) -> tuple[float, ...]:
        values = self.get(name)
        if isinstance(values, str) or not isinstance(values, Sequence) or not values:
            raise self.fail(name, f"is an empty grid; give at least one number {'>= ' + format(low, 'g') if high == math.inf else f'in [{low:g}, {high:g}]'}")
        for value in values:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and low <= value <= high):
                raise self.fail(name, f"has {value!r}; every value must be a number {'>= ' + format(low, 'g') if high == math.inf else f'in [{low:g}, {high:g}]'}")
        if len(set(values)) != len(values):
            raise self.fail(name, "lists a value twice; list each once")
        return tuple(float(v) for v in values)

    def text(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(name, "must be non-empty text")
        return value

    def only(self, *allowed: str) -> None:
        unknown = sorted(set(self.values) - set(allowed))
        if unknown:
            raise self.fail(unknown[0], f"is not a parameter of this stage; known: {', '.join(allowed)}")


def _platforms_config(s: _Section) -> PlatformTableConfig:
    s.only("platforms")
    return PlatformTableConfig(s.names("platforms", (*available_platforms(), HOST), "platform"))


def _sweep_config(s: _Section, methods: Sequence[str], vary: str) -> SweepConfig:
    """``vary`` is the budget the stage sweeps: ``memory`` (fractions) or ``runtime`` (factors)."""
    common = ("time_limit_s", "mip_gap", "threads", "workers", "batch_size", "runtime_factors" if vary == "runtime" else "runtime_factor")
    if vary == "memory":
        s.only("models", "platforms", "fractions", "extra_cases", *common)
        models = s.names("models", tuple(PAPER_MODELS), "model")
        platforms = s.names("platforms", available_platforms(), "platform")
        cases = tuple((m, p) for p in platforms for m in models)
        # (model, platform) pairs beside the grid (optional), e.g. the Cortex-M candidates on the Cortex-M panels only
        extra = _cases(s, "extra_cases") if "extra_cases" in s.values else ()
        cases += tuple(case for case in dict.fromkeys(extra) if case not in cases)
        fractions = s.grid("fractions", 0.0, 1.0)
        factors = (float(s.number("runtime_factor", 1.0)),)
        chosen = tuple(methods)
    else:
        s.only("cases", "fraction", "methods", "remat_window_points", *common)
        cases = _cases(s, "cases")
        fractions = (float(s.number("fraction", 0.0, 1.0)),)
        factors = s.grid("runtime_factors", 1.0)
        chosen = s.names("methods", methods, "method")
    return SweepConfig(
        cases=cases, fractions=fractions, runtime_factors=factors, methods=chosen,
        time_limit_s=float(s.number("time_limit_s", 0.1)), threads=int(s.number("threads", 1, 64, integer=True)),
        batch_size=int(s.number("batch_size", 1, integer=True)), workers=int(s.number("workers", 1, 64, integer=True)),
        mip_gap=_mip_gap(s),
        remat_window_points=s.grid("remat_window_points", 0.0, 10.0) if "remat_window_points" in s.values else (),
    )


def _pair_config(s: _Section, methods: Sequence[str], platforms: str = "platform") -> SweepConfig:
    """One model on one platform (``platforms="platform"``) or on a list of them (``"platforms"``), a
    ladder of memory budgets, POET and one baseline."""
    s.only("model", platforms, "fractions", "runtime_factor", "time_limit_s", "mip_gap", "threads", "batch_size")
    model = s.name("model", tuple(PAPER_MODELS), "model")
    if platforms == "platform":
        cases = ((model, s.name("platform", available_platforms(), "platform")),)
    else:
        cases = tuple((model, p) for p in s.names("platforms", available_platforms(), "platform"))
    return SweepConfig(
        cases=cases, fractions=s.grid("fractions", 0.0, 1.0), runtime_factors=(float(s.number("runtime_factor", 1.0)),),
        methods=tuple(methods), time_limit_s=float(s.number("time_limit_s", 0.1)),
        threads=int(s.number("threads", 1, 64, integer=True)), batch_size=int(s.number("batch_size", 1, integer=True)),
        mip_gap=_mip_gap(s),
    )


def _mip_gap(s: _Section) -> float:
    """The stage's ``mip_gap`` (optional: POET's default when absent)."""
    return float(s.number("mip_gap", 0.0, 0.5)) if "mip_gap" in s.values else SweepConfig.mip_gap


def _cases(s: _Section, name: str) -> tuple[tuple[str, str], ...]:
    values = s.get(name)
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise s.fail(name, "must be a non-empty list of [model, platform] pairs")
    platforms = available_platforms()
    cases = []
    for value in values:
        if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
            raise s.fail(name, f"has {value!r}; each case is a [model, platform] pair")
        model, platform = value
        if model not in PAPER_MODELS:
            raise s.fail(name, f"has unknown model {model!r}; valid models: {', '.join(PAPER_MODELS)}")
        if platform not in platforms:
            raise s.fail(name, f"has unknown platform {platform!r}; valid platforms: {', '.join(platforms)}")
        cases.append((model, platform))
    return tuple(cases)


def _graphs_config(s: _Section) -> dict[str, Any]:
    """The ``graphs`` stage: ``graph_table(**params)``; checked here, read by its notebook as they are."""
    s.only("models", "platforms", "batch_size")
    return {
        "models": s.names("models", tuple(PAPER_MODELS), "model"),
        "platforms": s.names("platforms", available_platforms(), "platform"),
        "batch_size": int(s.number("batch_size", 1, MAX_BATCH_SIZE, integer=True)),
    }


def _baselines_config(s: _Section) -> dict[str, Any]:
    """The ``baselines`` stage: ``comparison_table(**params)``; checked here, read by its notebook as they are."""
    s.only("cases", "fractions", "runtime_factor", "methods", "time_limit_s", "threads")
    return {
        "cases": _cases(s, "cases"),
        "fractions": s.grid("fractions", 0.0, 1.0),
        "runtime_factor": float(s.number("runtime_factor", 1.0)),
        "methods": s.names("methods", tuple(METHODS), "method"),
        "time_limit_s": float(s.number("time_limit_s", 0.1)),
        "threads": int(s.number("threads", 1, 64, integer=True)),
    }


def _feasibility_config(s: _Section) -> FeasibilityConfig:
    s.only("models", "platforms", "batch_size")
    return FeasibilityConfig(
        s.names("models", tuple(PAPER_MODELS), "model"), s.names("platforms", available_platforms(), "platform"),
        int(s.number("batch_size", 1, integer=True)),
    )


def _claims_config(s: _Section) -> ClaimsConfig:
    s.only("gap_tolerance")
    return ClaimsConfig(float(s.number("gap_tolerance", 0.0, 1.0)))


def _report_config(s: _Section) -> ReportConfig:
    s.only("title")
    return ReportConfig(s.text("title"))


def _scheme_spec(s: _Section, name: str, n_layers: int) -> str:
    """A sparse-update scheme as ``parse_scheme`` reads it, for a model of ``n_layers`` updatable layers."""
    value = s.text(name)
    k = value[5:] if value.startswith("last-") else ""
    if value not in ("full", "bias-only", "sparse") and not (k.isdigit() and 1 <= int(k) <= n_layers):
        raise s.fail(name, f"is not a sparse-update scheme: {value!r}; valid: full, bias-only, sparse, last-K (K in 1..{n_layers})")
    return value


def _techniques_frontier_config(s: _Section) -> TechniquesFrontierConfig:
    from poetlab.planners.poet.backends import SOLVERS

    s.only("channels", "side", "depth", "platform", "relu_density", "density_margin", "sparse_scheme", "fractions", "runtime_factor", "time_limit_s", "mip_gap", "threads", "solver")
    depth = int(s.number("depth", 1, 64, integer=True))
    return TechniquesFrontierConfig(
        channels=int(s.number("channels", 1, 4096, integer=True)), side=int(s.number("side", 1, 4096, integer=True)), depth=depth,
        platform=s.name("platform", available_platforms(), "platform"), relu_density=float(s.number("relu_density", 0.0, 1.0)),
        density_margin=float(s.number("density_margin", 0.0, 10.0)), sparse_scheme=_scheme_spec(s, "sparse_scheme", depth + 1),
        fractions=s.grid("fractions", 0.0, 1.0), runtime_factor=float(s.number("runtime_factor", 1.0)),
        time_limit_s=float(s.number("time_limit_s", 0.1)), mip_gap=float(s.number("mip_gap", 0.0, 1.0)),
        threads=int(s.number("threads", 1, 64, integer=True)), solver=s.name("solver", SOLVERS, "solver"),
    )


def _user_models_config(s: _Section) -> UserModelsConfig:
    from poetlab.planners.poet.backends import SOLVERS

    s.only("models", "fuse", "platform", "fractions", "steps", "time_limit_s", "mip_gap", "threads", "solver")
    models = s.get("models")
    if isinstance(models, str) or not isinstance(models, Sequence) or not models:
        raise s.fail("models", "must be a non-empty list of model files, path/to/file.py:FUNCTION")
    for spec in models:
        path, _, function = str(spec).rpartition(":")
        if not (isinstance(spec, str) and path.endswith(".py") and function.isidentifier()):
            raise s.fail("models", f"has {spec!r}; give each model as path/to/file.py:FUNCTION")
        if not Path(path).is_file():
            raise s.fail("models", f"names {path}, which is not a file (paths are relative to the repository)")
    if len(set(models)) != len(models):
        raise s.fail("models", "lists a model twice; list each once")
    if not isinstance(s.get("fuse"), bool):
        raise s.fail("fuse", f"must be true or false, got {s.get('fuse')!r}")
    return UserModelsConfig(
        models=tuple(models), fuse=s.get("fuse"), platform=s.name("platform", available_platforms(), "platform"),
        fractions=s.grid("fractions", 0.0, 1.0), steps=int(s.number("steps", 1, 100, integer=True)),
        time_limit_s=float(s.number("time_limit_s", 0.1)), mip_gap=_mip_gap(s),
        threads=int(s.number("threads", 1, 64, integer=True)), solver=s.name("solver", SOLVERS, "solver"),
    )


def _tiny_training_config(s: _Section) -> TinyTrainingConfig:
    from poetlab.torch.models import TORCH_MODELS

    s.only("model", "sparse_scheme", "batch_size", "seed")
    scheme = s.text("sparse_scheme")
    if scheme not in ("full", "bias-only", "sparse") and not (scheme.startswith("last-") and scheme[5:].isdigit() and int(scheme[5:]) >= 1):
        raise s.fail("sparse_scheme", f"is not a sparse-update scheme: {scheme!r}; valid: full, bias-only, sparse, last-K")
    return TinyTrainingConfig(s.name("model", tuple(TORCH_MODELS), "torch model"), scheme,
                              int(s.number("batch_size", 1, 4096, integer=True)), int(s.number("seed", 0, integer=True)))


def _bittrain_config(s: _Section) -> BitTrainConfig:
    s.only("width", "depth", "batch_size", "checkpoints", "lr", "seed")
    checkpoints = s.grid("checkpoints", 0.0, 100_000.0)
    if any(c != int(c) for c in checkpoints):
        raise s.fail("checkpoints", "must be whole numbers of SGD steps")
    return BitTrainConfig(
        width=int(s.number("width", 1, 1024, integer=True)), depth=int(s.number("depth", 1, 64, integer=True)),
        batch_size=int(s.number("batch_size", 1, 1797, integer=True)), checkpoints=tuple(sorted(int(c) for c in checkpoints)),
        lr=float(s.number("lr", 1e-6, 10.0)), seed=int(s.number("seed", 0, integer=True)),
    )


STAGES: Mapping[str, Callable[[_Section], object]] = {
    "graphs": _graphs_config,
    "baselines": _baselines_config,
    "table2_platforms": _platforms_config,
    "fig3_frontier": lambda s: _sweep_config(s, ("poet",), "memory"),
    "fig4_runtime": lambda s: _sweep_config(s, tuple(MILP_VARIANTS), "runtime"),
    "fig5_capuchin": lambda s: _pair_config(s, ("poet", "poet_no_capuchin", "capuchin"), "platforms"),
    "table3_pofo": lambda s: _pair_config(s, ("poet", "pofo_time")),
    "feasibility": _feasibility_config,
    "claims": _claims_config,
    "report": _report_config,
    "techniques_frontier": _techniques_frontier_config,
    "user_models": _user_models_config,
    "tiny_training": _tiny_training_config,
    "bittrain": _bittrain_config,
}
assert set(MILP_VARIANTS) <= set(METHODS)


def stage_config(stage: str, preset: str | None = None, params_file: str | os.PathLike[str] = PARAMS_FILE) -> Any:
    """The validated parameters of reproduction ``stage`` in ``preset`` (default: the active one)."""
    if stage not in STAGES:
        raise InvalidArgumentError(f"unknown reproduction stage {stage!r}; valid stages: {', '.join(STAGES)}")
    if preset is None:
        preset = active_preset(params_file)
    values = stage_params(stage, preset, params_file)
    return STAGES[stage](_Section(stage, preset, values, str(params_file)))

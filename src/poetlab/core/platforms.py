"""Platforms: the coefficients of a device, loaded and validated from YAML.

A platform file (``<name>.yaml``; the paper's devices ship with the package in ``platform_specs/``) gives each coefficient as a mapping with a ``value``,
its ``unit`` and its ``source``. A value may be a plain number or an arithmetic expression over numbers
(``2000 / (0.012 * 0.020 * 3.3)``): the release writes its coefficients as such expressions, and keeping
them lets us evaluate exactly the same floating-point operations, so that our costs match the
release's to the last bit, while a reader sees where each number comes from.
"""

from __future__ import annotations

import ast
import math
import operator
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from poetlab.core.files import read_text_or_raise
from poetlab.errors import PlatformSpecError, UnknownNameError

#: The name of this machine as a platform: measured by `poetlab profile` (data/profiles), not a YAML file.
HOST = "host"

#: The unit every coefficient must declare; the loader refuses a file that says otherwise.
COEFFICIENT_UNITS: Mapping[str, str] = MappingProxyType(
    {
        "flops_per_s": "flop/s",
        "flop_per_j": "flop/J",
        "pagein_latency_s": "s",
        "pagein_throughput_bytes_per_s": "B/s",
        "pageout_latency_s": "s",
        "pageout_throughput_bytes_per_s": "B/s",
        "memory_power_w": "W",
        "compute_power_w": "W",
        "ram_bytes": "B",
    }
)
#: Coefficients a platform may leave out.
OPTIONAL_COEFFICIENTS = frozenset({"ram_bytes"})
_TOP_LEVEL_KEYS = frozenset({"name", "description", "coefficients", "notes"})
_COEFFICIENT_KEYS = frozenset({"value", "unit", "source"})
PLATFORM_DIR_ENV = "POETLAB_PLATFORM_DIR"


@dataclass(frozen=True)
class Platform:
    """The cost coefficients of one device, in SI units.

    ``flops_per_s`` sets runtimes and ``flop_per_j`` compute energies; they are separate because the
    release derives them from different measurements on some devices (on the A72, runtime uses 2 GFLOP/s
    while energy uses the measured 120 MFLOP/s benchmark). ``compute_power_w`` is documentation of how
    ``flop_per_j`` was derived; ``ram_bytes`` is the device's memory, where known.
    """

    name: str
    description: str
    flops_per_s: float
    flop_per_j: float
    pagein_latency_s: float
    pagein_throughput_bytes_per_s: float
    pageout_latency_s: float
    pageout_throughput_bytes_per_s: float
    memory_power_w: float
    compute_power_w: float
    ram_bytes: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    path: Path | None = field(default=None, compare=False)

    def pagein_time_s(self, nbytes: float) -> float:
        """Seconds to read ``nbytes`` back from flash (latency + size / throughput)."""
        return self.pagein_latency_s + nbytes / self.pagein_throughput_bytes_per_s

    def pageout_time_s(self, nbytes: float) -> float:
        """Seconds to write ``nbytes`` out to flash."""
        return self.pageout_latency_s + nbytes / self.pageout_throughput_bytes_per_s


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}

#: Bounds on a platform expression, so that a hostile file cannot make the checker hang or overflow:
#: its length in characters, the nesting depth of its syntax tree, the size of any number in it or
#: computed on the way, and the size of an exponent.
MAX_EXPRESSION_CHARS = 400
MAX_EXPRESSION_DEPTH = 24
MAX_OPERAND = 1e30
MAX_EXPONENT = 64

#: The physical range a coefficient of each unit must fall in (inclusive). Wide enough for any device
#: from a microcontroller to a datacenter accelerator; narrow enough to catch a typo of many orders of
#: magnitude or a value that would overflow the costs.
UNIT_RANGES: Mapping[str, tuple[float, float]] = MappingProxyType(
    {
        "flop/s": (1.0, 1e18),
        "flop/J": (1.0, 1e16),
        "s": (1e-12, 3600.0),
        "B/s": (1.0, 1e14),
        "W": (1e-9, 1e6),
        "B": (1.0, 1e16),
    }
)


def evaluate_number(expression: str | int | float) -> float:
    """Evaluate a number or an arithmetic expression of numbers (+ - * / ** and parentheses).

    Nothing else is allowed (no names, no calls), so a platform file cannot run code; and every step is
    bounded (:data:`MAX_EXPRESSION_CHARS`, :data:`MAX_EXPRESSION_DEPTH`, :data:`MAX_OPERAND`,
    :data:`MAX_EXPONENT`), so it cannot make the checker hang, overflow or run out of memory. Integers stay
    integers as in Python (``1024 ** 3``), so the release's expressions give the same floats bit for bit.
    """
    if isinstance(expression, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(expression, int | float):
        return _bounded(expression, repr(expression))
    if not isinstance(expression, str):
        raise ValueError(f"expected a number or an arithmetic expression, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is {len(expression)} characters long; at most {MAX_EXPRESSION_CHARS} are allowed")
    shown = expression if len(expression) <= 60 else expression[:57] + "..."

    def walk(node: ast.AST, depth: int) -> int | float:
        if depth > MAX_EXPRESSION_DEPTH:
            raise ValueError(f"{shown!r} is nested more than {MAX_EXPRESSION_DEPTH} levels deep")
        if isinstance(node, ast.Expression):
            return walk(node.body, depth + 1)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return _bounded(node.value, shown)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left, depth + 1), walk(node.right, depth + 1)
            if isinstance(node.op, ast.Pow):
                if abs(right) > MAX_EXPONENT:
                    raise ValueError(f"{shown!r} has an exponent of {right:g}; exponents must be within ±{MAX_EXPONENT}")
                if left == 0 and right < 0:
                    raise ValueError(f"{shown!r} divides by zero")
                if left < 0 and not float(right).is_integer():
                    raise ValueError(f"{shown!r} raises a negative number to a fractional power")
                if left != 0 and right > 0 and right * math.log10(abs(left)) > math.log10(MAX_OPERAND):
                    raise ValueError(f"{shown!r} computes a number above {MAX_OPERAND:g}")
            try:
                result = _OPERATORS[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ValueError(f"{shown!r} divides by zero") from None
            except OverflowError:
                raise ValueError(f"{shown!r} computes a number above {MAX_OPERAND:g}") from None
            return _bounded(result, shown)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.operand, depth + 1))
        raise ValueError(f"only numbers and + - * / ** are allowed, found {ast.dump(node)[:40]}")

    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError):
        raise ValueError(f"{shown!r} is not an arithmetic expression") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"{shown!r} is nested more than {MAX_EXPRESSION_DEPTH} levels deep") from None
    return float(walk(tree, 0))


def _bounded(value: int | float, shown: str) -> int | float:
    """``value`` if it is a finite number within ±:data:`MAX_OPERAND`, else a one-line ValueError."""
    if isinstance(value, complex) or abs(value) > MAX_OPERAND or not math.isfinite(value):
        raise ValueError(f"{shown!r} computes {value!r}; numbers must be finite and within ±{MAX_OPERAND:g}")
    return value


def platform_from_mapping(spec: Any, origin: str) -> Platform:
    """Build a :class:`Platform` from the parsed YAML ``spec``; ``origin`` names it in errors."""

    def fail(problem: str) -> PlatformSpecError:
        return PlatformSpecError(f"{origin}: {problem}")

    def check_keys(mapping: Mapping, allowed: frozenset[str], required: tuple[str, ...], prefix: str = "") -> None:
        unknown = set(mapping) - allowed
        if unknown:
            raise fail(f"unknown key '{prefix}{sorted(unknown)[0]}'; allowed: {', '.join(sorted(allowed))}")
        for key in required:
            if key not in mapping:
                raise fail(f"missing field '{prefix}{key}'")

    if not isinstance(spec, Mapping):
        raise fail("expected a mapping with keys name, description, coefficients")
    check_keys(spec, _TOP_LEVEL_KEYS, ("name", "description", "coefficients"))
    name, description = spec["name"], spec["description"]
    if not isinstance(name, str) or not name.isidentifier():
        raise fail(f"field 'name' must be a short identifier, got {name!r}")
    if not isinstance(description, str):
        raise fail("field 'description' must be text")
    coefficients = spec["coefficients"]
    if not isinstance(coefficients, Mapping):
        raise fail("field 'coefficients' must be a mapping of coefficient name to {value, unit, source}")
    unknown = set(coefficients) - set(COEFFICIENT_UNITS)
    if unknown:
        raise fail(f"unknown coefficient {sorted(unknown)[0]!r}; known: {', '.join(COEFFICIENT_UNITS)}")

    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    for key, unit in COEFFICIENT_UNITS.items():
        where = f"coefficients.{key}"
        if key not in coefficients:
            if key in OPTIONAL_COEFFICIENTS:
                continue
            raise fail(f"missing field {where!r}")
        entry = coefficients[key]
        if not isinstance(entry, Mapping):
            raise fail(f"field {where!r} must be a mapping with value, unit and source")
        check_keys(entry, _COEFFICIENT_KEYS, ("value", "unit", "source"), prefix=f"{where}.")
        if entry["unit"] != unit:
            raise fail(f"field {where!r} must be in {unit!r}, the file says {entry['unit']!r}")
        if not isinstance(entry["source"], str) or not entry["source"].strip():
            raise fail(f"field '{where}.source' must say where the number comes from")
        try:
            value = evaluate_number(entry["value"])
        except ValueError as exc:
            raise fail(f"field '{where}.value': {exc}") from None
        low, high = UNIT_RANGES[unit]
        if not low <= value <= high:
            raise fail(f"field '{where}.value' must be a positive number between {low:g} and {high:g} {unit}, got {value:g}")
        values[key] = value
        sources[key] = entry["source"]
    return Platform(
        name=name,
        description=description,
        sources=MappingProxyType(sources),
        path=None,
        **values,
    )


def load_platform_file(path: str | os.PathLike[str]) -> Platform:
    """Load and validate one platform YAML file."""
    path = Path(path)
    text = read_text_or_raise(path, PlatformSpecError, "no such platform file", "cannot read the file")
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise PlatformSpecError(f"{path}: invalid YAML{at}: {problem}") from None
    platform = platform_from_mapping(spec, str(path))
    if platform.name != path.stem:
        raise PlatformSpecError(f"{path}: field 'name' is {platform.name!r} but the file is named {path.stem!r}")
    return _with_path(platform, path)


def _with_path(platform: Platform, path: Path) -> Platform:
    values = {f.name: getattr(platform, f.name) for f in fields(platform)}
    values["path"] = path
    return Platform(**values)


#: The paper's devices (m0, m4, a72, a72nocache, jetsontx2). They ship inside the package, beside this
#: module, because they define what a platform name means: a name works wherever poetlab is installed,
#: with or without a checkout's data folder.
BUILTIN_PLATFORM_DIR = Path(__file__).with_name("platform_specs")


def default_platform_dir() -> Path:
    """Where platform names are looked up: ``$POETLAB_PLATFORM_DIR``, else the built-in
    :data:`BUILTIN_PLATFORM_DIR`. A device of your own is a YAML file passed by path, or a folder of
    them passed as ``platform_dir`` (``--platform-dir``)."""
    env = os.environ.get(PLATFORM_DIR_ENV)
    if env:
        return Path(env)
    return BUILTIN_PLATFORM_DIR


def available_platforms(platform_dir: str | os.PathLike[str] | None = None) -> tuple[str, ...]:
    """Names of the platform files in ``platform_dir`` (default: :func:`default_platform_dir`)."""
    directory = Path(platform_dir) if platform_dir is not None else default_platform_dir()
    if not directory.is_dir():
        raise PlatformSpecError(
            f"platform directory {directory} not found; unset {PLATFORM_DIR_ENV} or point it (or --platform-dir) at a folder of platform YAML files"
        )
    return tuple(sorted(p.stem for p in directory.glob("*.yaml")))


def load_platform(name_or_path: str | os.PathLike[str], platform_dir: str | os.PathLike[str] | None = None) -> Platform:
    """Load a platform by name (``a72``) from the platform directory, or from a YAML file path."""
    candidate = Path(name_or_path)
    if candidate.suffix in {".yaml", ".yml"}:
        return load_platform_file(candidate)
    name = str(name_or_path)
    names = available_platforms(platform_dir)
    if name not in names:
        raise UnknownNameError("platform", name, names)
    directory = Path(platform_dir) if platform_dir is not None else default_platform_dir()
    return load_platform_file(directory / f"{name}.yaml")

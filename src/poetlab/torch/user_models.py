"""``poetlab.torch.user_models``: your own model, named ``path/to/file.py:FUNCTION``.

The contract: the file defines ``FUNCTION()`` (no arguments) returning ``(module, inputs, targets,
loss_fn)``: an ``nn.Module`` in the mode to train in, the example batch (a tensor or a tuple of tensors:
the module's positional inputs), the targets (anything ``loss_fn`` takes, or None for a loss of the output
alone, ``loss_fn(output)``) and ``loss_fn`` returning a scalar tensor. The
example batch fixes the shapes: the graph is traced, planned and executed at them. ``examples/`` holds
models written to it; every command that takes a model name takes such a spec instead
(``poetlab solve --model examples/unet.py:make ...``), and so do :func:`poetlab.torch.models.build_torch_model`
and :func:`poetlab.torch.trace.trace_torch_model`.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from poetlab.errors import InvalidArgumentError

__all__ = ["OutputOnlyLoss", "UserModel", "is_user_model", "load_user_model", "user_model_name"]


@dataclass(frozen=True)
class UserModel:
    """What a model file's function returned (the fields of :class:`poetlab.torch.models.TorchModel`)."""

    name: str  # (the spec, path/to/file.py:FUNCTION)
    module: nn.Module
    inputs: torch.Tensor | tuple[torch.Tensor, ...]
    targets: object
    loss_fn: Callable

@dataclass(frozen=True)
class OutputOnlyLoss:
    """A model file's ``loss_fn(output)`` (its targets are None) taking the step's ``(output, targets)``: every
    caller of a loss (tracer, executor, plain step) calls it as ``loss_fn(output, targets)`` or
    ``loss_fn(output)``."""

    loss_fn: Callable

    def __call__(self, output: object, targets: object = None) -> torch.Tensor:
        return self.loss_fn(output)


_SPEC = re.compile(r"^(?P<path>.+\.py)(:(?P<function>[A-Za-z_][A-Za-z0-9_]*))?$")


def is_user_model(name: str) -> bool:
    """Whether ``name`` names a Python file (``path.py:FUNCTION``, or a bare ``path.py``, which is an error
    asking for the function) rather than a registered model."""
    return bool(_SPEC.match(name)) or ".py:" in name


def user_model_name(spec: str) -> str:
    """A name for files and graphs: the file's stem, and the function's name when it is not ``make``."""
    match = _SPEC.match(spec)
    if not match:
        return re.sub(r"[^A-Za-z0-9_.-]", "_", spec)
    stem, function = Path(match["path"]).stem, match["function"] or "make"
    return stem if function == "make" else f"{stem}_{function}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _tensors(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (tuple, list)) and len(value) > 0 and all(isinstance(v, torch.Tensor) for v in value)


def load_user_model(spec: str):
    """``(module, inputs, targets, loss_fn)`` from ``spec`` (``path/to/file.py:FUNCTION``) as a
    :class:`UserModel`; anything wrong is one :class:`InvalidArgumentError` line."""
    match = _SPEC.match(spec)
    if not match or not match["function"]:
        raise InvalidArgumentError(f"a model file is named path/to/file.py:FUNCTION (a function returning (module, inputs, targets, loss_fn)), got {spec!r}")
    path, function = Path(match["path"]), match["function"]
    if not path.is_file():
        raise InvalidArgumentError(f"model file {path} not found; give path/to/file.py:FUNCTION")
    module_name = f"poetlab_user_model_{re.sub(r'[^A-Za-z0-9_]', '_', str(path.resolve()))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise InvalidArgumentError(f"cannot load {path} as Python; give path/to/file.py:FUNCTION")
    code = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = code  # (dataclasses and pickling look their module up)
    try:
        loader_spec.loader.exec_module(code)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise InvalidArgumentError(f"{path} does not import: {_one_line(exc)}") from None
    make = getattr(code, function, None)
    if not callable(make):
        found = sorted(k for k, v in vars(code).items() if callable(v) and getattr(v, "__module__", None) == module_name and not isinstance(v, type))
        raise InvalidArgumentError(f"{path} has no function {function!r}; functions there: {', '.join(found) or 'none'}")
    try:
        made = make()
    except Exception as exc:
        raise InvalidArgumentError(f"{path}:{function}() failed: {_one_line(exc)}") from None
    if not isinstance(made, tuple) or len(made) != 4:
        got = f"a tuple of {len(made)}" if isinstance(made, tuple) else type(made).__name__
        raise InvalidArgumentError(f"{path}:{function} must return (module, inputs, targets, loss_fn), got {got}")
    module, inputs, targets, loss_fn = made
    if not isinstance(module, nn.Module):
        raise InvalidArgumentError(f"{path}:{function} must return an nn.Module first, got {type(module).__name__}")
    if not _tensors(inputs):
        raise InvalidArgumentError(f"{path}:{function}'s inputs must be a tensor or a tuple of tensors, got {type(inputs).__name__}")
    if not callable(loss_fn):
        raise InvalidArgumentError(f"{path}:{function}'s loss_fn must be callable, got {type(loss_fn).__name__}")
    if targets is None:
        loss_fn = OutputOnlyLoss(loss_fn)
    return UserModel(spec, module, inputs if isinstance(inputs, torch.Tensor) else tuple(inputs), targets, loss_fn)

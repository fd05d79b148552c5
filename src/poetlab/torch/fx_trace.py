"""``poetlab.torch.fx_trace``: the ``torch.fx`` trace of a user's module, with its shapes known.

Plain ``torch.fx.symbolic_trace`` sees shapes as symbols: ``B, T, C = x.size()`` becomes graph nodes, and
code written for eager PyTorch breaks on them (``self.bias[:, :, :T, :T]`` slices a real tensor with a
symbol, ``math.sqrt(k.size(-1))`` takes the square root of one). A training graph is traced on one example
batch and executed on batches of that shape anyway, so this tracer runs every operation it records
alongside on fake tensors of the example's shapes (``FakeTensorMode``: no data, no memory, no random
numbers) and hands the module's code concrete Python values for shape queries (``size``, ``shape``,
``dim``, ``len``, arithmetic on them). Shape values are then no graph nodes at all: nothing owns, frees
or pages them, and no node reads a tensor just to ask its size. Buffers are ``get_attr`` nodes
(constants of the step); tensors the code makes from scratch (``torch.arange(T)``) become fx tensor
constants, which the trace keeps on its own ``GraphModule`` and takes back off the user's module.

Tracing fails on data-dependent Python control flow (``if x.sum() > 0``) and other code fx cannot
record; :func:`symbolic_trace` then keeps tracing with each failing module as a leaf, to name every
offending module in one error with the way out (``leaf_modules=``).

The executor re-traces the user's module the same way (:func:`traced_module`, from the graph's metadata:
its leaf modules and example input shapes), so that graph nodes map onto the same fx nodes.
"""

from __future__ import annotations

import linecache
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import fx, nn

from poetlab.errors import PoetlabError

__all__ = ["TraceError", "symbolic_trace", "traced_module", "input_specs"]


class TraceError(PoetlabError, ValueError):
    """A module that ``torch.fx`` cannot trace, or a step that cannot run on the example batch."""


_FAKE = "poetlab_fake"  # (fx node meta key: the node's value on fake tensors)
_UNKNOWN = object()  # (a value the fake run could not compute: the node stays symbolic)
#: tensor methods that only ask about a tensor's shape or layout (their answers are concrete)
_QUERIES = frozenset({"size", "dim", "ndimension", "numel", "nelement", "stride", "element_size", "is_contiguous", "__len__"})
#: tensor attributes answered concretely
_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device", "is_cuda", "layout"})
_MAX_LEAF_RETRIES = 64


def _concrete(value: object) -> bool:
    """Whether ``value`` is a plain Python answer (a size, a number, a dtype) rather than tensor data."""
    if isinstance(value, (bool, int, float, torch.dtype, torch.device)):
        return True
    if isinstance(value, (tuple, list)):  # (torch.Size included)
        return all(_concrete(v) for v in value)
    return False


class _ShapeProxy(fx.Proxy):
    """An fx proxy that answers shape questions from its node's fake value."""

    def _fake(self) -> object:
        return self.node.meta.get(_FAKE, _UNKNOWN)

    def __getattr__(self, k: str):
        if k in _ATTRIBUTES:
            fake = self._fake()
            if isinstance(fake, torch.Tensor):
                return getattr(fake, k)
        return super().__getattr__(k)

    def __len__(self) -> int:
        fake = self._fake()
        if isinstance(fake, (torch.Tensor, tuple, list)):
            return len(fake)
        return super().__len__()

    def __iter__(self):
        fake = self._fake()
        if isinstance(fake, (torch.Tensor, tuple, list)):
            return iter([self[i] for i in range(len(fake))])
        raise TraceError("cannot iterate over a value of unknown length")


class _Tracer(fx.Tracer):
    """fx's tracer with concrete shapes (module docstring), remembering which module it is inside (to
    name it when tracing fails) and honouring extra leaf modules given by qualified name or class."""

    def __init__(self, leaf_modules: Iterable[str | type[nn.Module]] = (), specs: Sequence[object] | None = None):
        super().__init__()
        self.proxy_buffer_attributes = True  # (buffers are get_attr nodes: constants, sliceable by shapes)
        leaf_modules = tuple(leaf_modules)
        self.leaf_names = {leaf for leaf in leaf_modules if isinstance(leaf, str)}
        self.leaf_types = tuple(leaf for leaf in leaf_modules if isinstance(leaf, type))
        self.user_leaves: set[str] = set()  # (qualified names of the modules kept whole because the caller said so)
        self.stack: list[tuple[str, str]] = []
        self.failed_in: tuple[str, str] | None = None  # (qualified name, class) of the innermost module that failed
        self.specs = list(specs) if specs is not None else None
        self.fake_mode = None
        if self.specs is not None:
            from torch._subclasses.fake_tensor import FakeTensorMode

            self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self._placeholders = 0
        self._faking = False  # (while an operation runs on fake tensors, fx's patches step aside)

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.leaf_names or (self.leaf_types and isinstance(m, self.leaf_types)):
            self.user_leaves.add(module_qualified_name)
            return True
        return super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):
        if self._faking:  # (a leaf module run on fake tensors: its own code, not recorded)
            return forward(*args, **kwargs)
        path = self.path_of_module(m)
        self.stack.append((path, type(m).__name__))
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:
                self.failed_in = self.stack[-1]
            raise
        finally:
            self.stack.pop()

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if self._faking:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _ShapeProxy(node, self)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None, proxy_factory_fn=None):
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        if self.fake_mode is None:
            return proxy
        value = self._fake_value(kind, target, args, kwargs)
        proxy.node.meta[_FAKE] = value
        if kind in ("call_function", "call_method") and value is not _UNKNOWN and _concrete(value):
            on_tensor = any(isinstance(a, torch.Tensor) for a in self._fakes(list(args) + list(kwargs.values())) if a is not _UNKNOWN)
            if not on_tensor or (kind == "call_method" and target in _QUERIES) or (target is getattr and args[1] in _ATTRIBUTES):
                self.graph.erase_node(proxy.node)
                return value
        return proxy

    def _fakes(self, values: list[object]) -> list[object]:
        return [self._to_fake(v) for v in values]

    def _to_fake(self, value: object) -> object:
        if isinstance(value, fx.Proxy):
            return value.node.meta.get(_FAKE, _UNKNOWN)
        if isinstance(value, torch.Tensor):
            return self.fake_mode.from_tensor(value)  # type: ignore[union-attr]
        if isinstance(value, (tuple, list)):
            items = [self._to_fake(v) for v in value]
            return _UNKNOWN if any(v is _UNKNOWN for v in items) else type(value)(items) if not isinstance(value, torch.Size) else tuple(items)
        if isinstance(value, dict):
            items = {k: self._to_fake(v) for k, v in value.items()}
            return _UNKNOWN if any(v is _UNKNOWN for v in items.values()) else items
        if isinstance(value, slice):
            parts = [self._to_fake(v) for v in (value.start, value.stop, value.step)]
            return _UNKNOWN if any(v is _UNKNOWN for v in parts) else slice(*parts)
        return value

    def _fake_value(self, kind, target, args, kwargs) -> object:
        """The node's value on fake tensors, or _UNKNOWN where that cannot be run (data-dependent code)."""
        if kind == "placeholder":
            k, self._placeholders = self._placeholders, self._placeholders + 1
            spec = self.specs[k] if self.specs is not None and k < len(self.specs) else None
            if spec is None:
                return _UNKNOWN
            shape, dtype = spec
            with self.fake_mode:  # type: ignore[union-attr]
                return torch.empty(tuple(shape), dtype=getattr(torch, str(dtype).removeprefix("torch.")))
        if kind == "get_attr":
            value = self.root
            self._faking = True  # (fx's patched Module.__getattr__ would make a proxy of it again)
            try:
                for part in str(target).split("."):
                    value = getattr(value, part)
            finally:
                self._faking = False
            return self._to_fake(value) if isinstance(value, torch.Tensor) else _UNKNOWN
        fake_args, fake_kwargs = self._to_fake(tuple(args)), self._to_fake(dict(kwargs))
        if fake_args is _UNKNOWN or fake_kwargs is _UNKNOWN:
            return _UNKNOWN
        self._faking = True
        try:
            with self.fake_mode, torch.no_grad():  # type: ignore[union-attr]
                if kind == "call_function":
                    return target(*fake_args, **fake_kwargs)
                if kind == "call_method":
                    obj, *rest = fake_args
                    return getattr(obj, target)(*rest, **fake_kwargs)
                if kind == "call_module":
                    # (on fake parameters and buffers: a BatchNorm's statistics stay as they are; its forward
                    # alone: the user's hooks on it see the real step, not this)
                    module = self.root.get_submodule(target)
                    state = {f"module.{k}": self._to_fake(v) for k, v in [*module.named_parameters(), *module.named_buffers()]}
                    return torch.func.functional_call(_ForwardOnly(module), state, tuple(fake_args), fake_kwargs, tie_weights=False)
        except Exception:  # (data-dependent or unsupported on fake tensors: symbolic, as plain fx)
            return _UNKNOWN
        finally:
            self._faking = False
        return _UNKNOWN


class _ForwardOnly(nn.Module):
    """Holds a module and runs its ``forward`` alone, so that :func:`torch.func.functional_call` (which calls
    the module it is given, hooks included) runs the module on fake state without the user's hooks."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args: object, **kwargs: object) -> object:
        return self.module.forward(*args, **kwargs)


def _user_frame(exc: BaseException) -> str:
    """``file:line `code``` of the deepest traceback frame outside torch and poetlab: the user's
    operation that fx could not trace."""
    torch_dir = str(Path(torch.__file__).resolve().parent)
    here = str(Path(__file__).resolve().parent)
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        filename = str(Path(frame.filename).resolve()) if not frame.filename.startswith("<") else frame.filename
        if filename.startswith(torch_dir) or filename.startswith(here) or filename.startswith("<"):
            continue
        code = (frame.line or linecache.getline(frame.filename, frame.lineno)).strip()
        found = f"{Path(frame.filename).name}:{frame.lineno} `{code}`"
    return found


def input_specs(inputs: Sequence[object]) -> list[list[object] | None]:
    """``[shape, dtype]`` of each example input (None for a non-tensor): what :func:`symbolic_trace` needs
    to make shapes concrete, kept in a traced graph's metadata (JSON)."""
    return [[list(t.shape), str(t.dtype)] if isinstance(t, torch.Tensor) else None for t in inputs]


def _trace_once(module: nn.Module, leaves: Sequence[str | type[nn.Module]], specs) -> tuple[fx.GraphModule | None, _Tracer, BaseException | None]:
    """One fx trace; the user's module is left as it was (fx puts tensor constants on its root: they go
    onto the GraphModule, which keeps its own reference, and off the module)."""
    before = set(module.__dict__)
    tracer = _Tracer(leaves, specs)
    try:
        with torch.random.fork_rng(devices=[]):
            graph = tracer.trace(module)
        return fx.GraphModule(tracer.root, graph, module.__class__.__name__), tracer, None
    except Exception as exc:  # fx raises TraceError, TypeError, RuntimeError... for untraceable code
        return None, tracer, exc
    finally:
        for name in set(module.__dict__) - before:
            delattr(module, name)


def symbolic_trace(module: nn.Module, leaf_modules: Iterable[str | type[nn.Module]] = (), specs: Sequence[object] | None = None) -> fx.GraphModule:
    """``torch.fx`` trace of ``module`` (shapes concrete where ``specs``, from :func:`input_specs`, are given);
    a failure is one :class:`TraceError` naming every module fx could not trace (each failing module is
    made a leaf and the trace goes on, to find the next), the operation in each, and the way out."""
    leaves = list(leaf_modules)
    failures: list[tuple[tuple[str, str] | None, str, str]] = []
    while True:
        gm, tracer, exc = _trace_once(module, leaves, specs)
        if exc is None:
            break
        failed = tracer.failed_in
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        failures.append((failed, _user_frame(exc), first))
        if failed is None or not failed[0] or failed[0] in leaves or len(failures) >= _MAX_LEAF_RETRIES:
            break
        leaves.append(failed[0])
    if failures:
        parts = []
        for failed, where, first in failures:
            inside = f"module '{failed[0]}' ({failed[1]})" if failed else f"{type(module).__name__}'s own forward"
            parts.append(f"{inside}: {first}" + (f" at {where}" if where else ""))
        names = [f[0][0] for f in failures if f[0] and f[0][0]]
        classes = list(dict.fromkeys(f[0][1] for f in failures if f[0] and f[0][0]))
        way_out = (
            f"mark them leaves (poetlab.torch.trace(..., leaf_modules=({', '.join(repr(n) for n in names)},)) or by class: "
            f"leaf_modules=({', '.join(classes)},)) or remove the data-dependent Python control flow"
            if names else "remove the data-dependent Python control flow from the model's forward"
        )
        raise TraceError(f"torch.fx cannot trace {type(module).__name__} in {len(failures)} place(s): {'; '.join(parts)}; {way_out}")
    assert gm is not None
    for n in gm.graph.nodes:
        n.meta.pop(_FAKE, None)
    gm.meta["poetlab_user_leaves"] = sorted(tracer.user_leaves)
    return gm


def traced_module(module: nn.Module, metadata: dict) -> fx.GraphModule:
    """``module`` traced as :func:`poetlab.torch.trace` traced it for a graph with ``metadata`` (its leaf
    modules and example input shapes): the fx nodes that the graph's nodes name."""
    specs = metadata.get("input_specs")
    return symbolic_trace(module, tuple(metadata.get("leaf_modules", ())), specs)


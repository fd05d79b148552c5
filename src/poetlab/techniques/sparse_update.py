"""Tiny Training's sparse update, quantization-aware scaling and in-place updates, for real in PyTorch.

Reference: J. Lin, L. Zhu, W.-M. Chen, W.-C. Wang, C. Gan, S. Han, *On-Device Training Under 256KB
Memory*, NeurIPS 2022 (arXiv:2206.15472, code: github.com/mit-han-lab/tiny-training). The paper trains a
quantized MobileNetV2 (width 0.35, 128x128, batch 1) on a microcontroller by (1) *sparse update*:
updating only some layers' weights (possibly a fraction of their output channels) and some biases, so
that the backward pass stops early and frozen layers keep nothing for it; (2) *quantization-aware
scaling* (QAS): scaling each int8 weight's gradient by s^-2 so that the weight-to-gradient norm ratio
matches floating-point training; (3) its Tiny Training Engine, which prunes the backward graph at
compile time and *reorders* it so that each weight is updated as soon as its gradient exists and the
gradient buffer is freed at once. It reports that sparse update cuts peak memory 7-9x against full
update, and 20-21x with reordering.

What is reproduced:

- Schemes (:class:`SparseUpdateScheme`): full, bias-only, last-k layers, and chosen layers with channel
  ratios, over the model's convolution and linear layers in forward order.
- :func:`apply_scheme` makes a scheme real: BatchNorm is folded into the convolutions first (the paper's
  quantized graph has no BatchNorm) and ReLUs run in place, for every scheme, full update included; frozen weights get ``requires_grad=False``; a frozen convolution
  on the backward path runs through :class:`_FrozenConv2d`, which keeps only its weight (a reference to
  the parameter) because the gradient of its input needs nothing else, where PyTorch's convolution would
  keep its input too; a layer with a channel ratio r < 1 is split into a trained convolution over the
  first r of its output channels and a frozen one over the rest. Frozen parts upstream of the first
  trained layer see no tensor that requires grad, so autograd records nothing there at all. Nothing is
  masked: the gradients that are not needed are never computed.
- :func:`scheme_memory_bytes`: the memory cost function of a scheme, the bytes the backward pass needs
  (saved activations, counted from the real tensors one forward pass saves, plus the gradient buffers
  of the trained parameters); it is what a scheme search would minimise.
- :func:`inplace_sgd`: per-parameter ``register_post_accumulate_grad_hook`` hooks apply the SGD step the
  moment a gradient is complete and drop the gradient, the engine's reordering expressed in PyTorch.
- :func:`qas_scale` and :class:`QuantizedLinear`-style int8 weights (``weight = scale * w_int``):
  the gradient of ``w_int`` is ``scale`` times the float gradient, so its norm ratio is off by
  ``scale^-2``; QAS multiplies the gradient by ``scale^-2``, after which SGD on ``w_int`` moves
  ``scale * w_int`` exactly as float SGD moves the weight (tested).

What is not: the contribution-analysis search of the paper's schemes (we measure given schemes), int8
kernels (the quantized weights here are float tensors holding integers, the activations are float), and
the code generator. Our memory is measured from PyTorch's CPU allocator, not on a microcontroller.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from poetlab.errors import InvalidArgumentError

# ---- schemes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerUpdate:
    """Update the weight of layer ``index`` (in :func:`updatable_layers` order) over the first
    ``channel_ratio`` of its output channels."""

    index: int
    channel_ratio: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.channel_ratio <= 1.0:
            raise InvalidArgumentError(f"channel ratio of layer {self.index} must be in (0, 1], got {self.channel_ratio!r}")


@dataclass(frozen=True)
class SparseUpdateScheme:
    """Which weights and biases a training step updates.

    ``weights``: the layers whose weights are updated; ``bias_from``: every layer from this index on
    updates its bias (None: no bias), as the paper updates the biases of the last blocks.
    ``full``: everything is trained (plain training, no BatchNorm folding)."""

    name: str
    weights: tuple[LayerUpdate, ...] = ()
    bias_from: int | None = None
    full: bool = False

    @classmethod
    def full_update(cls) -> SparseUpdateScheme:
        return cls("full", full=True)

    @classmethod
    def bias_only(cls) -> SparseUpdateScheme:
        return cls("bias-only", bias_from=0)

    @classmethod
    def last_k(cls, n_layers: int, k: int) -> SparseUpdateScheme:
        """Weights and biases of the last ``k`` of ``n_layers`` layers."""
        if not 1 <= k <= n_layers:
            raise InvalidArgumentError(f"k must be between 1 and the {n_layers} layers, got {k!r}")
        return cls(f"last-{k}", tuple(LayerUpdate(i) for i in range(n_layers - k, n_layers)), n_layers - k)

    @classmethod
    def chosen(cls, layers: dict[int, float], bias_from: int | None, name: str = "sparse") -> SparseUpdateScheme:
        return cls(name, tuple(LayerUpdate(i, r) for i, r in sorted(layers.items())), bias_from)


def tiny_training_scheme(module: nn.Module) -> SparseUpdateScheme:
    """A scheme shaped like the paper's MobileNetV2 one (its Figure 6): the classifier, the weights of
    the last four pointwise (1x1) convolutions at channel ratios 1, 1/2, 1/4, 1/8 going back, and the
    biases from the earliest of those on. The paper finds its scheme by contribution analysis; this is a
    fixed stand-in of the same shape."""
    layers = updatable_layers(module)
    pointwise = [i for i, (_, layer) in enumerate(layers) if isinstance(layer, nn.Conv2d) and layer.kernel_size == (1, 1) and layer.groups == 1]
    if isinstance(layers[-1][1], nn.Linear):
        chosen = {len(layers) - 1: 1.0}
    else:
        chosen = {}
    for ratio, index in zip((1.0, 0.5, 0.25, 0.125), reversed(pointwise), strict=False):
        chosen[index] = ratio
    return SparseUpdateScheme.chosen(chosen, min(chosen), "sparse")


def updatable_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The convolution and linear layers of ``module``, in registration order (forward order for the
    kit's models)."""
    return [(name, layer) for name, layer in module.named_modules() if isinstance(layer, (nn.Conv2d, nn.Linear))]


# ---- making a scheme real --------------------------------------------------------------------------


def fold_batchnorm(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with every BatchNorm2d that directly follows a Conv2d in an nn.Sequential
    folded into that convolution (with the running statistics, as for deployment), and replaced by
    Identity. Tiny Training's quantized graphs are BatchNorm-free in the same way."""
    module = copy.deepcopy(module)
    for parent in module.modules():
        if not isinstance(parent, nn.Sequential):
            continue
        children = list(parent.named_children())
        for (_, conv), (bn_name, bn) in zip(children, children[1:], strict=False):
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                _fold_into(conv, bn)
                setattr(parent, bn_name, nn.Identity())
    return module


@torch.no_grad()
def _fold_into(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> None:
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
    conv.bias = nn.Parameter((bias - bn.running_mean) * scale + bn.bias)


class _FrozenConvFunction(torch.autograd.Function):
    """A convolution with a frozen weight that keeps only the weight for backward: the gradient of the
    input is a transposed convolution of the output gradient with the weight, and the gradient of the
    bias is a sum; neither needs the input."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):  # type: ignore[override]
        ctx.conv = (x.shape, stride, padding, dilation, groups)
        ctx.save_for_backward(weight)
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        shape, stride, padding, dilation, groups = ctx.conv
        grad_x = torch.nn.grad.conv2d_input(shape, weight, grad, stride, padding, dilation, groups) if ctx.needs_input_grad[0] else None
        grad_b = grad.sum((0, 2, 3)) if ctx.needs_input_grad[2] else None
        return grad_x, None, grad_b, None, None, None, None


def _frozen_conv2d(x, weight, bias, stride, padding, dilation, groups):
    """The convolution of a frozen weight: plain ``conv2d`` when nothing upstream needs a gradient (autograd
    records nothing), else :class:`_FrozenConvFunction`. A module-level function marked ``torch.fx.wrap``
    so that ``torch.fx`` records it as one call (its test of ``requires_grad`` is not traceable), which lets
    :func:`poetlab.torch.trace` and :func:`poetlab.torch.execute` handle a scheme-applied model like any other."""
    if not (x.requires_grad or (bias is not None and bias.requires_grad)):
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return _FrozenConvFunction.apply(x, weight, bias, stride, padding, dilation, groups)


torch.fx.wrap("_frozen_conv2d")


class _FrozenConv2d(nn.Module):
    """Stands in for a Conv2d whose weight is not trained (its bias may be)."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.weight = nn.Parameter(conv.weight.detach(), requires_grad=False)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach(), requires_grad=False)
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _frozen_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class _ChannelSparseConv2d(nn.Module):
    """A Conv2d whose first ``k`` output channels are trained and the rest frozen, as two convolutions
    whose outputs are concatenated: the weight gradient has k channels, not all of them."""

    def __init__(self, conv: nn.Conv2d, k: int):
        super().__init__()
        if conv.groups != 1:
            raise InvalidArgumentError("a channel ratio below 1 needs a dense convolution (groups=1); give this depthwise layer ratio 1")
        self.trained = nn.Conv2d(conv.in_channels, k, conv.kernel_size, conv.stride, conv.padding, conv.dilation, 1, bias=False)
        with torch.no_grad():
            self.trained.weight.copy_(conv.weight[:k])
        frozen = copy.deepcopy(conv)
        frozen.weight = nn.Parameter(conv.weight.detach()[k:].clone(), requires_grad=False)
        frozen.bias = None
        frozen.out_channels = conv.out_channels - k
        self.frozen = _FrozenConv2d(frozen)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.cat((self.trained(x), self.frozen(x)), dim=1)
        return out if self.bias is None else out + self.bias.reshape(1, -1, 1, 1)


def apply_scheme(module: nn.Module, scheme: SparseUpdateScheme, inplace_relu: bool = True) -> nn.Module:
    """A copy of ``module`` set up to train under ``scheme`` (see the module docstring). For the full
    scheme, the copy with BatchNorm folded and everything trainable, so that full and sparse update
    train the same network.

    ``inplace_relu=False`` leaves the activations out of place: what :func:`scheme_graph` traces, because
    a planner's unit is one tensor per node and an in-place activation makes two nodes share one storage.
    It changes only a transient: autograd saves the same bytes either way (an in-place ReLU saves its
    output, which is the convolution's storage; an in-place ReLU6 saves a copy of its input, since
    ``hardtanh_``'s backward reads the input, so in place gains nothing there)."""
    model = fold_batchnorm(module)
    for layer in model.modules():
        if inplace_relu and isinstance(layer, (nn.ReLU, nn.ReLU6)):
            layer.inplace = True  # the engine computes activations in place; autograd allows it after a conv
    layers = updatable_layers(model)
    n = len(layers)
    for update in scheme.weights:
        if not 0 <= update.index < n:
            raise InvalidArgumentError(f"scheme {scheme.name!r} names layer {update.index}, but the model has {n} (0..{n - 1})")
    if scheme.full:
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    for p in model.parameters():
        p.requires_grad_(False)
    ratio = {u.index: u.channel_ratio for u in scheme.weights}
    for index, (name, layer) in enumerate(layers):
        train_bias = scheme.bias_from is not None and index >= scheme.bias_from and layer.bias is not None
        if isinstance(layer, nn.Linear):
            layer.weight.requires_grad_(index in ratio)
            if layer.bias is not None:
                layer.bias.requires_grad_(train_bias)
            continue
        if index in ratio and ratio[index] < 1.0:
            replacement: nn.Module = _ChannelSparseConv2d(layer, max(1, round(ratio[index] * layer.out_channels)))
        elif index in ratio:
            layer.weight.requires_grad_(True)
            replacement = layer
        else:
            replacement = _FrozenConv2d(layer)
        if replacement.bias is not None:
            replacement.bias.requires_grad_(train_bias)
        _set_submodule(model, name, replacement)
    return model


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, module)


# ---- the memory cost function ----------------------------------------------------------------------


@dataclass(frozen=True)
class SchemeMemory:
    """What a scheme's backward pass needs, in bytes: the activations autograd saves (distinct
    storages, parameters excluded) and the gradient buffers of the trained parameters (SGD without
    momentum keeps no optimizer state). ``total_bytes`` is their sum."""

    scheme: str
    saved_activation_bytes: int
    gradient_bytes: int
    trainable_params: int

    @property
    def total_bytes(self) -> int:
        return self.saved_activation_bytes + self.gradient_bytes


def saved_storage_bytes(model: nn.Module, work) -> int:
    """Bytes of the distinct storages autograd saves while running ``work()``, the model's parameters and
    buffers left out, frozen ones included (a frozen convolution keeps its weight, which stays where the
    weights are, in flash on the paper's device, not in activation RAM). Counted per storage, so a tensor
    saved twice (a convolution's input that an in-place ReLU also saves as its output) counts once."""
    constants = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in constants:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        work()
    return sum(seen.values())


def scheme_memory_bytes(model: nn.Module, inputs: torch.Tensor, scheme_name: str = "") -> SchemeMemory:
    """The memory cost of training ``model`` (already set up by :func:`apply_scheme`) on ``inputs``,
    from one real forward pass: what autograd saved, plus one gradient buffer per trained parameter."""
    saved = saved_storage_bytes(model, lambda: model(inputs))
    trained = [p for p in model.parameters() if p.requires_grad]
    return SchemeMemory(
        scheme=scheme_name,
        saved_activation_bytes=saved,
        gradient_bytes=sum(p.numel() * p.element_size() for p in trained),
        trainable_params=sum(p.numel() for p in trained),
    )


# ---- in-place updates and QAS ------------------------------------------------------------------------


def inplace_sgd(parameters: Iterable[nn.Parameter], lr: float, grad_scale: dict[nn.Parameter, float] | None = None) -> list:
    """Apply ``p -= lr * scale * p.grad`` the moment each gradient is accumulated, then drop it, so no
    two gradient buffers need to coexist beyond what the backward kernels hold (the Tiny Training
    Engine's reordering). ``grad_scale`` maps a parameter to a factor (QAS's ``scale^-2``). Returns the
    hook handles (``handle.remove()`` to undo)."""
    if not (math.isfinite(lr) and lr > 0):
        raise InvalidArgumentError(f"learning rate must be a positive number, got {lr!r}")
    scales = grad_scale or {}

    def make_hook(factor: float):
        def hook(p: torch.Tensor) -> None:
            with torch.no_grad():
                p.add_(p.grad, alpha=-lr * factor)
            p.grad = None

        return hook

    return [p.register_post_accumulate_grad_hook(make_hook(scales.get(p, 1.0))) for p in parameters if p.requires_grad]


@dataclass(frozen=True)
class Int8Weight:
    """A weight quantized per tensor: ``w_int`` (integers in [-127, 127], as a float parameter so that
    autograd can train it) and ``scale``; the layer computes with ``scale * w_int``."""

    w_int: nn.Parameter
    scale: float

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int8Weight:
        scale = float(weight.detach().abs().max()) / 127.0 or 1.0
        return cls(nn.Parameter(torch.round(weight.detach() / scale).clamp(-127, 127)), scale)

    def dequantized(self) -> torch.Tensor:
        return self.scale * self.w_int


def qas_scale(weights: Sequence[Int8Weight]) -> dict[nn.Parameter, float]:
    """Quantization-aware scaling: the factor ``scale^-2`` for each quantized weight's gradient.

    With W = s * w_int, the chain rule gives grad(w_int) = s * grad(W), while |w_int| = |W| / s: the
    ratio |w_int| / |grad(w_int)| is s^-2 times the float ratio |W| / |grad(W)|, so with s ~ 1e-2 the
    update is 10^4 times too small relative to the weight. Scaling grad(w_int) by s^-2 restores the
    float ratio exactly, and an SGD step of learning rate lr on w_int then changes W = s * w_int by
    -lr * grad(W): float SGD, without a hyper-parameter (the paper's Eq. 2)."""
    return {w.w_int: w.scale**-2 for w in weights}


def apply_qas_(weights: Sequence[Int8Weight]) -> None:
    """Scale the gradients of ``weights`` in place by their QAS factors."""
    for w in weights:
        if w.w_int.grad is not None:
            w.w_int.grad.mul_(w.scale**-2)


# ---- measuring a scheme on a real model ---------------------------------------------------------------


def parse_scheme(spec: str, module: nn.Module) -> SparseUpdateScheme:
    """``full``, ``bias-only``, ``last-K`` or ``sparse`` (:func:`tiny_training_scheme`) for ``module``."""
    n = len(updatable_layers(module))
    if spec == "full":
        return SparseUpdateScheme.full_update()
    if spec == "bias-only":
        return SparseUpdateScheme.bias_only()
    if spec == "sparse":
        return tiny_training_scheme(module)
    if spec.startswith("last-") and spec[5:].isdigit():
        return SparseUpdateScheme.last_k(n, int(spec[5:]))
    raise InvalidArgumentError(f"unknown sparse-update scheme {spec!r}; valid: full, bias-only, last-K (K in 1..{n}), sparse")


@dataclass(frozen=True)
class SchemeMeasurement:
    """One training step (forward, backward, SGD update) of a real model under a scheme, measured from
    the allocator. ``step_peak_bytes``: the peak over the whole step of what the step allocated
    (activations, gradients, temporaries, kernel workspaces), excluding the parameters and the input
    batch, which exist before it; ``backward_peak_bytes``: the same peak restricted to the backward
    pass and update (what sparse update and in-place updates act on); ``trainable_param_bytes``: the
    parameters that must sit in RAM to be updated (Tiny Training keeps frozen weights in flash)."""

    scheme: str
    inplace: bool
    step_peak_bytes: int
    forward_peak_bytes: int
    backward_peak_bytes: int
    trainable_param_bytes: int
    cost: SchemeMemory


def measure_scheme(module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, scheme: SparseUpdateScheme, inplace: bool = False, lr: float = 0.01) -> SchemeMeasurement:
    """Set ``module`` up for ``scheme`` (a copy), run two training steps and measure the second."""
    from poetlab.techniques.memory import measure_peak_bytes, phase

    model = apply_scheme(module, scheme)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr)
    handles = inplace_sgd(params, lr) if inplace else []

    def step() -> None:
        with phase("forward"):
            loss = F.cross_entropy(model(inputs), targets)
        with phase("backward"):
            loss.backward()
            if not inplace:
                optimizer.step()

    try:
        with torch.random.fork_rng(devices=[]):
            for _ in range(2):
                optimizer.zero_grad(set_to_none=True)
                measured = measure_peak_bytes(step)
    finally:
        for handle in handles:
            handle.remove()
    return SchemeMeasurement(
        scheme=scheme.name,
        inplace=inplace,
        step_peak_bytes=measured.peak_bytes,
        forward_peak_bytes=measured.phase_peak("forward"),
        backward_peak_bytes=measured.phase_peak("backward"),
        trainable_param_bytes=sum(p.numel() * p.element_size() for p in params),
        cost=scheme_memory_bytes(model, inputs, scheme.name),
    )

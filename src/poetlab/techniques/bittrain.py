"""BitTrain: lossless bitmap compression of the activations autograd saves for the backward pass.

Reference: A. Hosny, M. Neseem, S. Reda, *Sparse Bitmap Compression for Memory-Efficient Training on
the Edge*, IEEE/ACM SEC 2021 (doi:10.1145/3453142.3491290, code: github.com/scale-lab/BitTrain). The
paper stores each sparse activation as a bitmap (one bit per element: zero or not) plus the packed
non-zero values, during the forward pass, and restores it for the backward pass; it reports "up to 34%
reduction in the memory footprint at a sparsity level of 50%" and "up to 56%" above 70% sparsity.

What is reproduced: the format (1 bit per element + the non-zeros in order), exactly lossless; applied
to every tensor autograd saves for backward through ``torch.autograd.graph.saved_tensors_hooks`` (the
hook point PyTorch's own ``save_on_cpu`` uses), keeping a tensor dense when its density is above the
break-even point (for float32: bitmap n/8 bytes + 4 n d bytes < 4 n bytes, so d < 31/32); parameters and
tiny tensors are never compressed. A tensor saved twice (a ReLU saves its output, the next convolution
saves the same tensor as its input) is compressed once and shared, as its dense original was.

What is not: the paper's own C++/CUDA kernels and its pruning schedule that makes activations sparser
than 50%. Here density is whatever the model produces; :func:`shift_relu_density` makes a model's
activations sparser on purpose (a negative BatchNorm bias before each ReLU) so that memory can be
measured against density, standing in for the paper's pruning.
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from poetlab.errors import InvalidArgumentError

#: below this many elements a tensor is kept dense (the bookkeeping would cost more than it saves)
MIN_NUMEL = 1024
_SHIFTS = torch.arange(7, -1, -1, dtype=torch.uint8)
_INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def break_even_density(itemsize: int = 4) -> float:
    """The density below which the bitmap format is smaller than the dense tensor: 1 - 1 / (8 itemsize)."""
    return 1.0 - 1.0 / (8 * itemsize)


def compressed_bytes(numel: int, density: float, itemsize: int = 4) -> int:
    """Bytes of the bitmap format for ``numel`` elements of which a fraction ``density`` is non-zero."""
    return math.ceil(numel / 8) + math.ceil(density * numel) * itemsize


@dataclass(frozen=True, eq=False)
class BitmapTensor:
    """A tensor as a packed bitmap of its non-zeros (uint8, 8 elements per byte) and their values."""

    shape: torch.Size
    dtype: torch.dtype
    bitmap: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.bitmap.numel() + self.values.numel() * self.values.element_size()

    @property
    def density(self) -> float:
        return self.values.numel() / max(1, math.prod(self.shape))


def as_words(data: torch.Tensor | torch.UntypedStorage) -> torch.Tensor:
    """The bytes of a flat tensor, or of a whole storage, as one flat tensor of 4-byte integers (1-byte
    when the size is not a multiple of 4) sharing its memory. The bitmap format compares bit patterns,
    so the element type does not change what is kept: these are the words a compressed copy counts,
    whether the executor compresses a node's storage or a density is measured over it."""
    if isinstance(data, torch.UntypedStorage):
        raw = torch.empty(0, dtype=torch.uint8).set_(data, 0, (data.nbytes(),), (1,))
    else:
        raw = data.contiguous().view(torch.uint8)
    return raw.view(torch.int32) if raw.numel() % 4 == 0 else raw


def compress(tensor: torch.Tensor) -> BitmapTensor:
    """The bitmap form of ``tensor`` (any shape, contiguous or not)."""
    flat = tensor.detach().reshape(-1)
    mask = _nonzero_bits(flat)
    padded = torch.nn.functional.pad(mask, (0, (-flat.numel()) % 8)).view(-1, 8).to(torch.uint8)
    bitmap = (padded << _SHIFTS).sum(dim=1, dtype=torch.uint8)
    return BitmapTensor(tensor.shape, tensor.dtype, bitmap, flat[mask].clone())


def _nonzero_bits(flat: torch.Tensor) -> torch.Tensor:
    """Elements whose bit pattern is not all zeros: -0.0 is kept as a value, so the format is lossless
    bit for bit, not just in value."""
    if flat.is_floating_point() and flat.element_size() in _INT_OF_SIZE:
        return flat.view(_INT_OF_SIZE[flat.element_size()]) != 0
    return flat != 0


def decompress(packed: BitmapTensor) -> torch.Tensor:
    """The dense tensor again, bit for bit."""
    numel = math.prod(packed.shape)
    mask = ((packed.bitmap[:, None] >> _SHIFTS) & 1).view(-1)[:numel].bool()
    out = torch.zeros(numel, dtype=packed.dtype)
    out[mask] = packed.values
    return out.view(packed.shape)


@dataclass
class BitTrainStats:
    """What the hooks saw: ``saved_bytes`` dense bytes of the distinct tensors offered for saving,
    ``stored_bytes`` the bytes actually kept (compressed or dense), per-tensor densities."""

    saved_bytes: int = 0
    stored_bytes: int = 0
    n_compressed: int = 0
    n_dense: int = 0
    densities: list[float] = field(default_factory=list)
    pack_time_s: float = 0.0
    unpack_time_s: float = 0.0

    @property
    def reduction(self) -> float:
        return 1.0 - self.stored_bytes / self.saved_bytes if self.saved_bytes else 0.0


@contextlib.contextmanager
def bittrain(max_density: float | None = None, min_numel: int = MIN_NUMEL, stats: BitTrainStats | None = None) -> Iterator[BitTrainStats]:
    """Within this context, every floating-point tensor autograd saves for backward whose density is
    below ``max_density`` (default: the break-even density) is kept in bitmap form and restored when
    the backward pass needs it. Parameters (leaves that require grad) stay as they are."""
    limit = break_even_density() if max_density is None else float(max_density)
    if not 0.0 <= limit <= 1.0:
        raise InvalidArgumentError(f"max_density must be in [0, 1] (0 keeps everything dense), got {max_density!r}")
    stats = BitTrainStats() if stats is None else stats
    # storage address -> weak references to the tensor and to its bitmap form: the first tells a tensor
    # saved twice from a new tensor that reuses a freed address; neither keeps anything alive, so a
    # bitmap is freed as soon as autograd drops it
    cache: dict[tuple[int, int, tuple[int, ...], tuple[int, ...], int], tuple[weakref.ref, weakref.ref]] = {}

    def pack(tensor: torch.Tensor) -> object:
        if (tensor.requires_grad and tensor.is_leaf) or not tensor.is_floating_point() or tensor.numel() < min_numel or tensor.layout != torch.strided:
            return tensor
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor._version)
        hit = cache.get(key)
        if hit is not None and hit[0]() is not None:
            packed = hit[1]()
            if packed is not None:
                return packed
        started = time.perf_counter()
        nbytes = tensor.numel() * tensor.element_size()
        density = float(torch.count_nonzero(_nonzero_bits(tensor.detach().reshape(-1)))) / tensor.numel()
        stats.saved_bytes += nbytes
        stats.densities.append(density)
        if density < limit:
            packed = compress(tensor)
            stats.stored_bytes += packed.nbytes
            stats.n_compressed += 1
            cache[key] = (weakref.ref(tensor), weakref.ref(packed))
            stats.pack_time_s += time.perf_counter() - started
            return packed
        stats.stored_bytes += nbytes
        stats.n_dense += 1
        cache[key] = (weakref.ref(tensor), weakref.ref(tensor))
        stats.pack_time_s += time.perf_counter() - started
        return tensor

    def unpack(stored: object) -> torch.Tensor:
        if isinstance(stored, BitmapTensor):
            started = time.perf_counter()
            out = decompress(stored)
            stats.unpack_time_s += time.perf_counter() - started
            return out
        return stored  # type: ignore[return-value]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield stats
    cache.clear()


def saved_activation_bytes(work, min_numel: int = MIN_NUMEL) -> tuple[int, list[float]]:
    """Dense bytes (and densities) of the distinct non-parameter tensors autograd saves while running
    ``work()``: BitTrain's denominator, measured with a pass-through hook."""
    stats = BitTrainStats()
    with bittrain(max_density=0.0, min_numel=min_numel, stats=stats):
        work()
    return stats.saved_bytes, stats.densities


def shift_relu_density(module: nn.Module, bias: float) -> int:
    """Set the bias of every BatchNorm2d to ``bias`` (in units of the normalised activation, so the
    following ReLU passes about Phi(bias) of its inputs); returns how many layers were changed.

    At initialisation a BatchNorm + ReLU passes half its inputs; trained and pruned networks (BitTrain's
    setting) are sparser. A negative bias reproduces that sparsity on a seeded random model so that
    memory can be measured against density."""
    changed = 0
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, nn.BatchNorm2d):
                layer.bias.fill_(bias)
                changed += 1
    return changed


@dataclass(frozen=True)
class BitTrainMeasurement:
    """One training step of a real model with and without BitTrain (same weights, same batch).

    ``saved_bytes`` / ``stored_bytes``: the saved activations dense / as BitTrain keeps them;
    ``peak_*_bytes``: the allocator's peak over the step (activations, gradients and temporaries;
    the parameters, which exist before the step, are ``param_bytes``); ``*_time_s``: the median step
    time of ``repeats`` steps; ``gradients_equal``: every parameter gradient bit-identical."""

    model: str
    batch_size: int
    relu_bias: float
    mean_relu_density: float
    saved_bytes: int
    stored_bytes: int
    n_compressed: int
    n_dense: int
    peak_plain_bytes: int
    peak_bittrain_bytes: int
    param_bytes: int
    plain_time_s: float
    bittrain_time_s: float
    gradients_equal: bool

    @property
    def activation_reduction(self) -> float:
        return 1.0 - self.stored_bytes / self.saved_bytes

    @property
    def training_memory_reduction(self) -> float:
        """Reduction of (parameters + the step's allocator peak): BitTrain's 'memory footprint'."""
        return 1.0 - (self.param_bytes + self.peak_bittrain_bytes) / (self.param_bytes + self.peak_plain_bytes)

    @property
    def time_overhead(self) -> float:
        return self.bittrain_time_s / self.plain_time_s - 1.0


def measure_bittrain(model: str = "resnet18_cifar_torch", batch_size: int = 8, relu_bias: float = 0.0, seed: int = 0, repeats: int = 3) -> BitTrainMeasurement:
    """Train one step of the kit's torch model ``model`` with and without BitTrain and compare."""
    import statistics

    from poetlab.techniques.memory import measure_peak_bytes, parameter_bytes
    from poetlab.torch.models import build_torch_model

    built = build_torch_model(model, batch_size, seed)
    module = built.module
    shift_relu_density(module, relu_bias)
    relu_densities: list[float] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: relu_densities.append(float(torch.count_nonzero(out)) / out.numel())) for m in module.modules() if isinstance(m, (nn.ReLU, nn.ReLU6))]

    def step() -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            built.loss_fn(module(built.inputs), built.targets).backward()

    def measured_step() -> int:
        """The allocator peak of one step, the previous gradients freed before it starts."""
        module.zero_grad(set_to_none=True)
        return measure_peak_bytes(step).peak_bytes

    module.zero_grad(set_to_none=True)
    step()
    for handle in hooks:
        handle.remove()
    plain_grads = [p.grad.clone() for p in module.parameters()]
    peak_plain = measured_step()
    stats = BitTrainStats()
    with bittrain(stats=stats):
        peak_bittrain = measured_step()
    gradients_equal = all(torch.equal(a, p.grad) for a, p in zip(plain_grads, module.parameters(), strict=True))
    del plain_grads

    def median_time(use: bool) -> float:
        times = []
        for _ in range(repeats):
            context = bittrain() if use else contextlib.nullcontext()
            with context:
                module.zero_grad(set_to_none=True)
                started = time.perf_counter()
                step()
                times.append(time.perf_counter() - started)
        return statistics.median(times)

    plain_time, bittrain_time = median_time(False), median_time(True)
    return BitTrainMeasurement(
        model=model,
        batch_size=batch_size,
        relu_bias=relu_bias,
        mean_relu_density=sum(relu_densities) / max(1, len(relu_densities)),
        saved_bytes=stats.saved_bytes,
        stored_bytes=stats.stored_bytes,
        n_compressed=stats.n_compressed,
        n_dense=stats.n_dense,
        peak_plain_bytes=peak_plain,
        peak_bittrain_bytes=peak_bittrain,
        param_bytes=parameter_bytes(module),
        plain_time_s=plain_time,
        bittrain_time_s=bittrain_time,
        gradients_equal=gradients_equal,
    )

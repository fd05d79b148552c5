"""BitTrain: the bitmap format is lossless bit for bit, and training through it gives the gradients of
plain autograd while storing less."""

from __future__ import annotations

import pytest
import torch

from poetlab.errors import InvalidArgumentError
from poetlab.techniques.bittrain import (
    BitTrainStats,
    bittrain,
    break_even_density,
    compress,
    compressed_bytes,
    decompress,
    saved_activation_bytes,
    shift_relu_density,
)
from poetlab.torch.models import ResNet18


@pytest.mark.parametrize("numel", [1, 7, 8, 1001])
def test_round_trip_is_bit_exact(numel):
    g = torch.Generator().manual_seed(numel)
    x = torch.randn(numel, generator=g)
    x[torch.rand(numel, generator=g) < 0.6] = 0.0
    if numel > 3:
        x[1], x[2] = -0.0, float("nan")
    packed = compress(x.reshape(-1, 1) if numel > 1 else x)
    back = decompress(packed).reshape(-1)
    assert torch.equal(back.view(torch.int32), x.view(torch.int32))
    nonzero = int((x.view(torch.int32) != 0).sum())
    assert packed.nbytes == compressed_bytes(numel, nonzero / numel)


def test_break_even_density():
    assert break_even_density(4) == pytest.approx(31 / 32)
    n = 32 * 1024
    assert compressed_bytes(n, 0.5) < 4 * n * 0.55
    assert compressed_bytes(n, break_even_density()) == pytest.approx(4 * n, rel=1e-3)


def _step(model, x, y):
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_gradients_equal_plain_autograd_and_memory_drops():
    torch.manual_seed(0)
    model = ResNet18(10, cifar_stem=True, width=8)
    shift_relu_density(model, -0.5)
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 7])
    plain = _step(model, x, y)
    with bittrain() as stats:
        packed = _step(model, x, y)
    assert all(torch.equal(a, b) for a, b in zip(plain, packed, strict=True))
    assert stats.n_compressed > 0 and stats.n_dense > 0  # BatchNorm inputs are dense, ReLU outputs sparse
    assert stats.stored_bytes < stats.saved_bytes
    dense_bytes, densities = saved_activation_bytes(lambda: model(x))
    assert dense_bytes == stats.saved_bytes and len(densities) == len(stats.densities)


def test_tensor_saved_twice_is_stored_once():
    a = torch.randn(64, 64, requires_grad=True)
    w = torch.randn(64, 8, requires_grad=True)
    with bittrain() as stats:
        r = torch.relu(a)  # saves its output
        (r @ w).sum().backward()  # mm saves r again
    assert stats.n_compressed == 1
    assert stats.saved_bytes == r.numel() * 4
    assert torch.equal(w.grad, torch.relu(a).detach().t() @ torch.ones(64, 8))


def test_dense_tensors_fall_back():
    a = torch.rand(64, 64, requires_grad=True) + 1.0  # no zeros
    stats = BitTrainStats()
    with bittrain(stats=stats):
        (a.exp() * 2).sum().backward()
    assert stats.n_compressed == 0 and stats.stored_bytes == stats.saved_bytes > 0


def test_bad_density_limit():
    with pytest.raises(InvalidArgumentError, match="max_density"), bittrain(max_density=2.0):
        pass

"""Tiny Training's sparse update, in-place SGD and QAS, against real autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from poetlab.errors import InvalidArgumentError
from poetlab.techniques.memory import measure_peak_bytes, phase
from poetlab.techniques.sparse_update import (
    Int8Weight,
    SparseUpdateScheme,
    _FrozenConvFunction,
    apply_qas_,
    apply_scheme,
    inplace_sgd,
    qas_scale,
    scheme_memory_bytes,
    tiny_training_scheme,
    updatable_layers,
)
from poetlab.torch.models import MobileNetV2


@pytest.fixture(scope="module")
def mbv2():
    torch.manual_seed(0)
    return MobileNetV2(10, 0.35), torch.randn(2, 3, 32, 32), torch.tensor([3, 5])


def _grads(model, x, y):
    model.eval()  # no dropout: the same function whatever is frozen
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def test_frozen_conv_gradients_match_autograd():
    torch.manual_seed(1)
    x = torch.randn(2, 6, 9, 9, requires_grad=True)
    w, b = torch.randn(6, 2, 3, 3), torch.randn(6, requires_grad=True)
    out = _FrozenConvFunction.apply(x, w, b, (2, 2), (1, 1), (1, 1), 3)
    grad = torch.randn_like(out)
    gx, gb = torch.autograd.grad(out, (x, b), grad)
    ref = F.conv2d(x, w, b, 2, 1, 1, 3)
    rx, rb = torch.autograd.grad(ref, (x, b), grad)
    assert torch.equal(out, ref)
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gb, rb)


def test_sparse_scheme_gradients_are_the_full_gradients_restricted(mbv2):
    module, x, y = mbv2
    scheme = tiny_training_scheme(module)
    assert any(u.channel_ratio < 1 for u in scheme.weights)
    full = apply_scheme(module, SparseUpdateScheme.full_update())
    sparse = apply_scheme(module, scheme)
    reference = _grads(full, x, y)
    got = _grads(sparse, x, y)
    layer_names = [name for name, _ in updatable_layers(full)]
    assert got, "the sparse scheme trains something"
    for update in scheme.weights:
        name = layer_names[update.index]
        ref = reference[f"{name}.weight"]
        if update.channel_ratio < 1:
            k = sparse.get_submodule(name).trained.out_channels
            torch.testing.assert_close(got[f"{name}.trained.weight"], ref[:k], rtol=1e-4, atol=1e-6)
        else:
            torch.testing.assert_close(got[f"{name}.weight"], ref, rtol=1e-4, atol=1e-6)
    for name, layer in updatable_layers(full)[scheme.bias_from:]:
        torch.testing.assert_close(got[f"{name}.bias"], reference[f"{name}.bias"], rtol=1e-4, atol=1e-6)
    trained = {name for name, p in sparse.named_parameters() if p.requires_grad}
    assert set(got) == trained


def test_frozen_parts_save_nothing_and_cost_orders_schemes(mbv2):
    module, x, _ = mbv2
    n = len(updatable_layers(module))
    costs = {
        s.name: scheme_memory_bytes(apply_scheme(module, s), x, s.name)
        for s in (SparseUpdateScheme.full_update(), SparseUpdateScheme.bias_only(), SparseUpdateScheme.last_k(n, 1), tiny_training_scheme(module))
    }
    # last-1 (the classifier): autograd keeps only the classifier's input (and the dropout mask)
    assert costs["last-1"].saved_activation_bytes <= 2 * 2 * 1280 * 4
    assert costs["last-1"].trainable_params == 1280 * 10 + 10
    assert costs["full"].total_bytes > costs["sparse"].total_bytes > costs["last-1"].total_bytes
    assert costs["full"].total_bytes > costs["bias-only"].total_bytes > costs["last-1"].total_bytes
    # bias-only keeps activations along the whole backward path, sparse only near the end (frozen
    # weights are parameters, never counted as saved activations)
    assert costs["full"].saved_activation_bytes > costs["bias-only"].saved_activation_bytes > costs["sparse"].saved_activation_bytes


def test_inplace_sgd_equals_optimizer_step_and_frees_gradients(mbv2):
    module, x, y = mbv2
    scheme = SparseUpdateScheme.last_k(len(updatable_layers(module)), 3)
    a, b = apply_scheme(module, scheme).eval(), apply_scheme(module, scheme).eval()
    opt = torch.optim.SGD([p for p in a.parameters() if p.requires_grad], lr=0.1)
    F.cross_entropy(a(x), y).backward()
    opt.step()
    handles = inplace_sgd(b.parameters(), lr=0.1)
    F.cross_entropy(b(x), y).backward()
    for h in handles:
        h.remove()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb)
        assert pb.grad is None


def test_sparse_update_backward_peak_is_lower_measured(mbv2):
    module, x, y = mbv2
    peaks = {}
    for scheme in (SparseUpdateScheme.full_update(), tiny_training_scheme(module)):
        model = apply_scheme(module, scheme)

        def step():
            with phase("forward"):
                loss = F.cross_entropy(model(x), y)
            with phase("backward"):
                loss.backward()

        peaks[scheme.name] = measure_peak_bytes(step).phase_peak("backward")
    # at 32x32 the gradient buffers weigh more than at 128x128, hence only 0.7
    assert 0 < peaks["sparse"] < 0.7 * peaks["full"]


def test_qas_restores_the_float_ratio_and_float_sgd():
    torch.manual_seed(2)
    weight = torch.randn(8, 16) * 0.05
    x, target = torch.randn(4, 16), torch.randn(4, 8)
    q = Int8Weight.quantize(weight)
    float_w = q.dequantized().detach().clone().requires_grad_(True)
    F.mse_loss(x @ float_w.t(), target).backward()
    F.mse_loss(x @ q.dequantized().t(), target).backward()
    # without QAS: the ratio is off by scale^-2
    ratio_float = float_w.norm() / float_w.grad.norm()
    ratio_int = q.w_int.norm() / q.w_int.grad.norm()
    torch.testing.assert_close(ratio_int, ratio_float * q.scale**-2, rtol=1e-4, atol=0)
    apply_qas_([q])
    torch.testing.assert_close(q.w_int.norm() / q.w_int.grad.norm(), ratio_float, rtol=1e-4, atol=0)
    torch.testing.assert_close(q.w_int.grad, float_w.grad / q.scale, rtol=1e-5, atol=1e-7)
    # an SGD step on w_int with the QAS gradient moves scale * w_int as float SGD moves W
    lr = 0.5
    with torch.no_grad():
        stepped_int = q.scale * (q.w_int - lr * q.w_int.grad)
        stepped_float = float_w - lr * float_w.grad
    torch.testing.assert_close(stepped_int, stepped_float, rtol=1e-5, atol=1e-7)
    assert qas_scale([q]) == {q.w_int: q.scale**-2}


def test_bad_schemes_are_refused(mbv2):
    module = mbv2[0]
    with pytest.raises(InvalidArgumentError, match="channel ratio"):
        SparseUpdateScheme.chosen({3: 0.0}, None)
    with pytest.raises(InvalidArgumentError, match="names layer 999"):
        apply_scheme(module, SparseUpdateScheme.chosen({999: 1.0}, None))
    depthwise = next(i for i, (_, l) in enumerate(updatable_layers(module)) if isinstance(l, nn.Conv2d) and l.groups > 1)
    with pytest.raises(InvalidArgumentError, match="depthwise"):
        apply_scheme(module, SparseUpdateScheme.chosen({depthwise: 0.5}, None))
    with pytest.raises(InvalidArgumentError, match="k must be"):
        SparseUpdateScheme.last_k(5, 6)
    with pytest.raises(InvalidArgumentError, match="learning rate"):
        inplace_sgd([], lr=-1.0)

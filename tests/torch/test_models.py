"""The torch models: built from a seed (twice the same seed, the same model and batch), an example batch of
the registry's shape, a forward pass to the classes, refusals of unknown names and bad batch sizes."""

from __future__ import annotations

import pytest
import torch

from poetlab.errors import InvalidArgumentError, UnknownNameError
from poetlab.torch.models import TORCH_MODELS, ConvChain, build_torch_model

SMALL = ("resnet18_cifar_torch", "vgg16_cifar_torch", "mobilenetv2_torch", "bert_small_torch")


@pytest.mark.parametrize("name", SMALL)
def test_a_model_and_its_batch_follow_the_registry(name):
    spec = TORCH_MODELS[name]
    built = build_torch_model(name, batch_size=2, seed=1)
    assert built.name == name and built.module.training
    assert tuple(built.inputs.shape) == (2, *spec.input_shape)
    assert built.inputs.dtype == (torch.int64 if spec.input_kind == "tokens" else torch.float32)
    assert built.targets.shape == (2,) and 0 <= int(built.targets.min()) and int(built.targets.max()) < spec.num_classes
    with torch.no_grad():
        logits = built.module.eval()(built.inputs)
    assert logits.shape == (2, spec.num_classes)
    assert torch.isfinite(built.loss_fn(logits, built.targets))


def test_the_same_seed_builds_the_same_model_and_batch_and_leaves_the_global_generator():
    state = torch.get_rng_state()
    a, b, c = (build_torch_model("bert_small_torch", 2, seed) for seed in (3, 3, 4))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert all(torch.equal(p, q) for p, q in zip(a.module.parameters(), b.module.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.module.parameters(), c.module.parameters(), strict=True))


def test_unknown_names_and_bad_batches_are_refused():
    with pytest.raises(UnknownNameError, match="unknown torch model 'resnet18_cifar'; valid torch models: bert_base_torch"):
        build_torch_model("resnet18_cifar")
    with pytest.raises(InvalidArgumentError):
        build_torch_model("bert_small_torch", batch_size=0)


def test_the_conv_chain_is_its_depth_of_convolutions():
    chain = ConvChain(channels=4, side=6, depth=5, num_classes=3)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in chain.modules()) == 5
    assert chain(torch.randn(2, 4, 6, 6)).shape == (2, 3)

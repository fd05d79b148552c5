"""Accuracy of full against sparse update on a small packaged data set: a transfer-learning run.

Tiny Training (Lin et al., NeurIPS 2022) fine-tunes an ImageNet-pretrained MobileNetV2 on downstream
data sets and reports that its sparse update matches full update's accuracy. Nothing may be downloaded
here, so the stand-in is scikit-learn's packaged digits (1797 8x8 images): a MobileNetV2 (width 0.35)
is pretrained with full update on digits 0-4, then fine-tuned on digits 5-9 under each scheme, and
tested on held-out 5-9 images. Images are upscaled (bilinear) to ``side`` pixels; the memory
measurements use 128x128, the accuracy run a smaller side by default to finish in about a minute on
two CPU cores. What is reproduced is the comparison (same pretrained model, same data, same steps),
not the paper's data sets or its accuracy numbers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from poetlab.errors import PoetlabError
from poetlab.techniques.sparse_update import SparseUpdateScheme, apply_scheme, inplace_sgd
from poetlab.torch.models import MobileNetV2


@dataclass(frozen=True)
class DigitsSplit:
    """Tensors of one split: images (N, 3, side, side) normalised, labels 0..4 (relabelled)."""

    x: torch.Tensor
    y: torch.Tensor


def load_digits_task(classes: tuple[int, ...], side: int, seed: int = 0, test_fraction: float = 0.3) -> tuple[DigitsSplit, DigitsSplit]:
    """(train, test) for the digits in ``classes``, relabelled 0..len-1, upscaled to ``side`` pixels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:  # pragma: no cover - a pinned dependency
        raise PoetlabError("scikit-learn is not installed; `pip install -c constraints.txt scikit-learn`") from None
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32) / 16.0
    labels = torch.tensor(digits.target)
    keep = torch.isin(labels, torch.tensor(classes))
    images, labels = images[keep], labels[keep]
    relabel = {c: i for i, c in enumerate(classes)}
    labels = torch.tensor([relabel[int(c)] for c in labels])
    x = F.interpolate(images[:, None], size=(side, side), mode="bilinear", align_corners=False)
    x = ((x - 0.3) / 0.4).expand(-1, 3, -1, -1).contiguous()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(test_fraction * len(labels)))
    test, train = order[:n_test], order[n_test:]
    return DigitsSplit(x[train], labels[train]), DigitsSplit(x[test], labels[test])


def train_epochs(model: nn.Module, data: DigitsSplit, epochs: int, lr: float, batch_size: int, seed: int, inplace: bool = False) -> None:
    """Plain SGD (momentum 0.9 unless ``inplace``, where each step is applied during backward)."""
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(seed)
    optimizer = None if inplace else torch.optim.SGD(params, lr=lr, momentum=0.9)
    handles = inplace_sgd(params, lr) if inplace else []
    model.train()
    try:
        for _ in range(epochs):
            order = torch.randperm(len(data.y), generator=generator)
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                loss = F.cross_entropy(model(data.x[batch]), data.y[batch])
                if optimizer is not None:
                    optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if optimizer is not None:
                    optimizer.step()
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def accuracy(model: nn.Module, data: DigitsSplit) -> float:
    model.eval()
    return float((model(data.x).argmax(dim=1) == data.y).float().mean())


@dataclass(frozen=True)
class TransferResult:
    scheme: str
    test_accuracy: float
    trainable_params: int


def digits_transfer(
    schemes: tuple[SparseUpdateScheme, ...],
    side: int = 32,
    pretrain_epochs: int = 3,
    finetune_epochs: int = 3,
    batch_size: int = 16,
    lr: float = 0.01,
    seed: int = 0,
) -> tuple[float, list[TransferResult]]:
    """Pretrain on digits 0-4, then fine-tune a copy per scheme on digits 5-9; returns the pretrained
    model's accuracy on its own task and one :class:`TransferResult` per scheme."""
    torch.manual_seed(seed)
    source_train, source_test = load_digits_task((0, 1, 2, 3, 4), side, seed)
    target_train, target_test = load_digits_task((5, 6, 7, 8, 9), side, seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        base = MobileNetV2(5, 0.35)
        train_epochs(base, source_train, pretrain_epochs, lr, batch_size, seed)
    source_accuracy = accuracy(base, source_test)
    results = []
    for scheme in schemes:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            model = apply_scheme(copy.deepcopy(base), scheme)
            # a fresh classifier for the new classes, trained under every scheme (as in the paper)
            old = model.classifier
            model.classifier = nn.Linear(old.in_features, old.out_features)
            train_epochs(model, target_train, finetune_epochs, lr, batch_size, seed + 1)
            results.append(TransferResult(scheme.name, accuracy(model, target_test), sum(p.numel() for p in model.parameters() if p.requires_grad)))
    return source_accuracy, results

"""Real PyTorch models for tracing, profiling and executing schedules (no torchvision, no downloads).

The paper-faithful models of :mod:`poetlab.core.paper_models` are layer lists with the release's flop
formulas; these are ``nn.Module`` s that run for real. Each is defined here in a few lines, because
torchvision does not import beside the pinned CPU torch and nothing may be downloaded at run time:

- ``resnet18_cifar_torch`` / ``resnet18_torch``: ResNet-18 (He et al. 2016), CIFAR stem (3x3 conv, no
  max-pool, 32x32 input, 10 classes) and ImageNet stem (7x7/2 conv, 3x3/2 max-pool, 224x224, 1000).
- ``vgg16_cifar_torch`` / ``vgg16_torch``: VGG-16 (configuration D) with BatchNorm-free conv stacks.
- ``mobilenetv2_torch``: MobileNetV2 (Sandler et al. 2018) with a width multiplier; the default is Tiny
  Training's setting (width 0.35, 128x128 input, 10 classes) rather than ImageNet's 224x224.
- ``bert_base_torch`` / ``bert_small_torch``: a BERT-style encoder from ``nn.TransformerEncoderLayer``
  (post-norm, GELU): base is 12 layers, hidden 768, 12 heads, sequence 512; small is 2 layers, hidden
  64, 2 heads, sequence 32, for tests.

Weights are random and seeded: a model built twice with the same seed is identical, parameter for
parameter. :func:`build_torch_model` returns the module with an example batch and the loss, everything
:func:`poetlab.torch.trace` and :func:`poetlab.torch.execute` need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn

from poetlab.errors import InvalidArgumentError, UnknownNameError

# ---- ResNet-18 ---------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a skip connection (a 1x1 projection when the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels))
            if stride != 1 or in_channels != out_channels
            else nn.Identity()
        )
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 10, cifar_stem: bool = True, width: int = 64):
        super().__init__()
        if cifar_stem:
            self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
            )
        blocks = []
        channels = width
        for stage, out_channels in enumerate((width, 2 * width, 4 * width, 8 * width)):
            for index in range(2):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(BasicBlock(channels, out_channels, stride))
                channels = out_channels
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(self.pool(self.blocks(self.stem(x)))))


# ---- VGG-16 ------------------------------------------------------------------------------------

VGG16_CONFIG: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG16(nn.Module):
    def __init__(self, num_classes: int = 10, image_side: int = 32, hidden: int = 512):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in VGG16_CONFIG:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, int(item), 3, 1, 1), nn.ReLU()]
                channels = int(item)
        self.features = nn.Sequential(*layers)
        side = image_side // 32
        self.flatten = nn.Flatten()
        self.classifier = nn.Sequential(
            nn.Linear(channels * side * side, hidden), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.flatten(self.features(x)))


# ---- MobileNetV2 -------------------------------------------------------------------------------


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Channel counts rounded to a multiple of 8, never down by more than 10% (the reference rule)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv_bn_relu(cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()
    )


class InvertedResidual(nn.Module):
    """1x1 expansion, 3x3 depthwise, 1x1 linear projection; a skip connection when shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = [] if expand == 1 else [_conv_bn_relu(cin, hidden, 1, 1)]
        layers += [_conv_bn_relu(hidden, hidden, 3, stride, groups=hidden), nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.use_skip = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_skip else self.conv(x)


MOBILENETV2_SETTINGS: tuple[tuple[int, int, int, int], ...] = (
    # expansion, channels, repeats, first stride
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 10, width_mult: float = 0.35):
        super().__init__()
        channels = _make_divisible(32 * width_mult)
        last = _make_divisible(1280 * max(1.0, width_mult))
        layers: list[nn.Module] = [_conv_bn_relu(3, channels, 3, 2)]
        for expand, c, repeats, stride in MOBILENETV2_SETTINGS:
            out = _make_divisible(c * width_mult)
            for index in range(repeats):
                layers.append(InvertedResidual(channels, out, stride if index == 0 else 1, expand))
                channels = out
        layers.append(_conv_bn_relu(channels, last, 1, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.flatten(self.pool(self.features(x)))))


# ---- a conv chain -------------------------------------------------------------------------------


class ConvChain(nn.Module):
    """(3x3 convolution -> ReLU) x ``depth`` on ``channels`` x ``side`` x ``side``, flattened into a linear
    classifier: the real counterpart of :func:`poetlab.core.paper_models.conv_chain_graph`, small enough for
    MILPs that solve in seconds (the techniques frontier). Not in the registry (no fixed size)."""

    def __init__(self, channels: int = 8, side: int = 8, depth: int = 3, num_classes: int = 4):
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Conv2d(channels, channels, 3, 1, 1), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.flatten = nn.Flatten()
        self.classifier = nn.Linear(channels * side * side, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.flatten(self.features(x)))


# ---- BERT-style encoder ------------------------------------------------------------------------


class Encoder(nn.Module):
    """Token and position embeddings, a stack of post-norm ``nn.TransformerEncoderLayer`` (GELU), and a
    classifier on the first token (BERT's [CLS] pooling, without the pooler's tanh layer)."""

    def __init__(self, vocab: int, seq_len: int, hidden: int, layers: int, heads: int, num_classes: int = 2, dropout: float = 0.1):
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Parameter(torch.zeros(1, seq_len, hidden))
        nn.init.normal_(self.position, std=0.02)
        self.layers = nn.Sequential(
            *(
                nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout, activation="gelu", batch_first=True)
                for _ in range(layers)
            )
        )
        self.norm = nn.LayerNorm(hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.token(tokens) + self.position
        return self.classifier(self.norm(self.layers(x))[:, 0])


# ---- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchModelSpec:
    """How to build one model and a batch for it. ``input_kind`` is ``"image"`` (float NCHW) or
    ``"tokens"`` (int64 token ids)."""

    name: str
    description: str
    factory: Callable[[], nn.Module]
    input_shape: tuple[int, ...]  # per example, without the batch dimension
    num_classes: int
    input_kind: str = "image"
    vocab: int = 0


@dataclass(frozen=True)
class TorchModel:
    """A built model, an example batch (inputs and integer targets), and its loss."""

    name: str
    module: nn.Module
    inputs: torch.Tensor
    targets: torch.Tensor
    loss_fn: nn.Module


TORCH_MODELS: MappingProxyType[str, TorchModelSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            TorchModelSpec("resnet18_cifar_torch", "ResNet-18, CIFAR stem, 3x32x32, 10 classes", lambda: ResNet18(10, cifar_stem=True), (3, 32, 32), 10),
            TorchModelSpec("resnet18_torch", "ResNet-18, ImageNet stem, 3x224x224, 1000 classes", lambda: ResNet18(1000, cifar_stem=False), (3, 224, 224), 1000),
            TorchModelSpec("vgg16_cifar_torch", "VGG-16, 3x32x32, 10 classes", lambda: VGG16(10, 32, 512), (3, 32, 32), 10),
            TorchModelSpec("vgg16_torch", "VGG-16, 3x224x224, 1000 classes", lambda: VGG16(1000, 224, 4096), (3, 224, 224), 1000),
            TorchModelSpec("mobilenetv2_torch", "MobileNetV2 width 0.35, 3x128x128, 10 classes (Tiny Training's setting)", lambda: MobileNetV2(10, 0.35), (3, 128, 128), 10),
            TorchModelSpec("bert_base_torch", "BERT-base-style encoder: 12 layers, hidden 768, 12 heads, sequence 512", lambda: Encoder(30522, 512, 768, 12, 12), (512,), 2, "tokens", 30522),
            TorchModelSpec("bert_small_torch", "small encoder: 2 layers, hidden 64, 2 heads, sequence 32", lambda: Encoder(1000, 32, 64, 2, 2), (32,), 2, "tokens", 1000),
        )
    }
)


def build_torch_model(name: str, batch_size: int = 1, seed: int = 0) -> TorchModel:
    """Build ``name`` with weights and an example batch drawn from ``seed``; the module is in train mode.
    A user's model (``path/to/file.py:FUNCTION``: :mod:`poetlab.torch.user_models`) is the file's, with its
    own batch and seed."""
    from poetlab.torch.user_models import is_user_model, load_user_model

    if is_user_model(name):
        return load_user_model(name)
    if name not in TORCH_MODELS:
        raise UnknownNameError("torch model", name, TORCH_MODELS)
    from poetlab.core.paper_models import check_batch_size

    check_batch_size(batch_size)
    spec = TORCH_MODELS[name]
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = spec.factory().train()
    if spec.input_kind == "tokens":
        inputs = torch.randint(spec.vocab, (batch_size, *spec.input_shape), generator=generator)
    else:
        inputs = torch.randn((batch_size, *spec.input_shape), generator=generator)
    targets = torch.randint(spec.num_classes, (batch_size,), generator=generator)
    return TorchModel(name, module, inputs, targets, nn.CrossEntropyLoss())

"""The paper's models, built as the POET release builds them (its layer lists and flop formulas).

These graphs are the "paper-faithful" models: their numbers must match the release's, so the release's
simplifications are kept on purpose and named here rather than fixed:

- a Linear layer's flop count is ``2 * params + out_features`` whatever the batch or sequence length;
- pooling flops assume stride 1; BatchNorm is counted as ``2 * prod(shape)``;
- the backward pass is a chain: one gradient node per consecutive pair of forward layers, reading the
  earlier layer, the later layer and the previous gradient, with ``2 * flop(earlier)`` flops and the
  later layer's output shape. Skip connections are not mirrored in the backward pass.

Traced PyTorch models (:mod:`poetlab.torch.trace`) mirror autograd's real dependencies instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from poetlab.errors import InvalidArgumentError, UnknownNameError
from poetlab.core.graph import Node, TrainingGraph

#: Bytes per activation element: the release stores every tensor as 4-byte floats.
BYTES_PER_ELEMENT = 4


@dataclass(frozen=True)
class Layer:
    """A forward layer of the release's layer list."""

    kind: str
    shape: tuple[int, ...]
    flop: int
    params: int
    inputs: tuple[int, ...]


class LayerList:
    """Appends layers with the release's shape, parameter and flop formulas; each method returns the
    new layer's index, which later layers use as their input."""

    def __init__(self) -> None:
        self.layers: list[Layer] = []

    def _add(self, kind: str, shape: tuple[int, ...], flop: int, params: int = 0, inputs: tuple[int, ...] = ()) -> int:
        self.layers.append(Layer(kind, tuple(int(s) for s in shape), int(flop), int(params), inputs))
        return len(self.layers) - 1

    def shape(self, index: int) -> tuple[int, ...]:
        return self.layers[index].shape

    @property
    def last(self) -> int:
        return len(self.layers) - 1

    def input(self, shape: tuple[int, ...]) -> int:
        return self._add("input", shape, 0)

    def linear(self, x: int, in_features: int, out_features: int, relu: bool = False) -> int:
        in_shape = self.shape(x)
        if len(in_shape) != 2 or in_shape[1] != in_features:
            raise ValueError(f"linear layer expects (batch, {in_features}) input, got {in_shape}")
        params = (in_features + 1) * out_features
        shape = (in_shape[0], out_features)
        flop = 2 * params + out_features + (math.prod(shape) if relu else 0)
        return self._add("linear_relu" if relu else "linear", shape, flop, params, (x,))

    def conv2d(self, x: int, in_channels: int, out_channels: int, kernel: int, stride: int, padding: int) -> int:
        batch, channels, height, width = self.shape(x)
        if channels != in_channels:
            raise ValueError(f"conv2d expects {in_channels} input channels, got {channels}")
        side_h = (height - kernel + 2 * padding) // stride + 1
        side_w = (width - kernel + 2 * padding) // stride + 1
        shape = (batch, out_channels, side_h, side_w)
        params = out_channels * in_channels * kernel * kernel + out_channels
        flop = 2 * kernel * kernel * math.prod(self.shape(x)) * out_channels + math.prod(shape)
        return self._add("conv2d", shape, flop, params, (x,))

    def batchnorm(self, x: int) -> int:
        shape = self.shape(x)
        return self._add("batchnorm2d", shape, 2 * math.prod(shape), 4 * shape[1], (x,))

    def elementwise(self, kind: str, x: int) -> int:
        """ReLU or Dropout: same shape, one flop per element."""
        shape = self.shape(x)
        return self._add(kind, shape, math.prod(shape), 0, (x,))

    def pool(self, kind: str, x: int, kernel: int, stride: int) -> int:
        batch, channels, height, width = self.shape(x)
        shape = (batch, channels, (height - kernel) // stride + 1, (width - kernel) // stride + 1)
        return self._add(kind, shape, 2 * kernel * kernel * math.prod(shape), 0, (x,))

    def flatten(self, x: int) -> int:
        in_shape = self.shape(x)
        shape = (in_shape[0], math.prod(in_shape[1:]))
        return self._add("flatten", shape, math.prod(shape), 0, (x,))

    def skip_add(self, a: int, b: int) -> int:
        shape = self.shape(a)
        return self._add("skip_add", shape, math.prod(shape), 0, (a, b))

    def cross_entropy(self, x: int, n_classes: int) -> int:
        return self._add("cross_entropy", (n_classes,), math.prod(self.shape(x)) * n_classes, 0, (x,))

    # ---- transformer blocks, as the release fuses them ---------------------------------------
    def qkv(self, x: int, seq: int, hidden: int, head_dim: int, heads: int) -> int:
        flop = 3 * seq * hidden * head_dim * heads
        return self._add("qkv", (3 * seq, head_dim, heads), flop, 3 * hidden * head_dim * heads, (x,))

    def qk_t(self, x: int, seq: int, head_dim: int, heads: int) -> int:
        """QK^T with mask and dropout fused. The release calls it with its ``I`` set to the sequence
        length, so the output is (seq, seq, heads)."""
        shape = (seq, seq, heads)
        flop = seq * head_dim * seq * heads + 2 * math.prod(shape)
        return self._add("qk_t", shape, flop, 0, (x,))

    def qk_t_v(self, x: int, seq: int, head_dim: int, heads: int) -> int:
        """(QK^T)V with the head concatenation fused."""
        flop = 2 * seq * seq * head_dim * heads
        return self._add("qk_t_v", (seq, head_dim * heads), flop, 0, (x,))


def training_graph(name: str, layers: LayerList, metadata: dict[str, object]) -> TrainingGraph:
    """Forward nodes from the layer list, then the release's chain-shaped backward pass."""
    forward = layers.layers
    nodes = [
        Node(
            name=f"fwd{i:03d}_{layer.kind}",
            kind=layer.kind,
            inputs=layer.inputs,
            output_shape=layer.shape,
            output_bytes=BYTES_PER_ELEMENT * math.prod(layer.shape),
            flop=layer.flop,
            param_bytes=BYTES_PER_ELEMENT * layer.params,
            is_backward=False,
        )
        for i, layer in enumerate(forward)
    ]
    # Walk the forward list backwards in consecutive pairs (earlier a, later b); the first gradient
    # reads the loss in the role of the previous gradient too, hence the release's duplicate edge.
    for b in range(len(forward) - 1, 0, -1):
        a = b - 1
        previous_gradient = len(nodes) - 1
        nodes.append(
            Node(
                name=f"bwd{a:03d}_{forward[a].kind}",
                kind="gradient",
                inputs=(a, b, previous_gradient),
                output_shape=forward[b].shape,
                output_bytes=BYTES_PER_ELEMENT * math.prod(forward[b].shape),
                flop=2 * forward[a].flop,
                param_bytes=0,
                is_backward=True,
            )
        )
    return TrainingGraph(name=name, nodes=tuple(nodes), metadata=metadata)


# ---- the release's models ---------------------------------------------------------------------
def _linear(batch_size: int) -> LayerList:
    net = LayerList()
    x = net.input((batch_size, 784))
    for in_dim, out_dim in [(784, 10), (10, 120), (120, 100), (100, 200), (200, 10), (10, 10)]:
        x = net.elementwise("relu", net.linear(x, in_dim, out_dim))
    net.cross_entropy(x, 10)
    return net


def _vgg16(batch_size: int, n_classes: int, image: tuple[int, int, int]) -> LayerList:
    net = LayerList()
    x = net.input((batch_size, *image))
    channels = image[0]
    for stage in ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512)):
        for width in stage:
            x = net.elementwise("relu", net.conv2d(x, channels, width, 3, 1, 1))
            channels = width
        x = net.pool("maxpool2d", x, 2, 2)
    x = net.flatten(x)
    x = net.linear(x, 512 * (image[1] // 32) * (image[2] // 32), 4096)
    x = net.elementwise("dropout", net.elementwise("relu", x))
    x = net.linear(x, 4096, 4096)
    x = net.elementwise("dropout", net.elementwise("relu", x))
    x = net.linear(x, 4096, n_classes)
    net.cross_entropy(x, n_classes)
    return net


def _resnet18(batch_size: int) -> LayerList:
    """ImageNet ResNet-18 as the release builds it (no padding on the max-pool, identity skips)."""
    net = LayerList()
    x = net.input((batch_size, 3, 224, 224))
    x = net.batchnorm(net.conv2d(x, 3, 64, 7, 2, 3))
    x = net.pool("maxpool2d", x, 3, 2)
    for in_planes, planes, stride in [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1),
                                      (128, 256, 2), (256, 256, 1), (256, 512, 2), (512, 512, 1)]:
        relu1 = net.elementwise("relu", net.batchnorm(net.conv2d(x, in_planes, planes, 3, stride, 1)))
        bn2 = net.batchnorm(net.conv2d(relu1, planes, planes, 3, 1, 1))
        x = net.elementwise("relu", net.skip_add(relu1, bn2))
    x = net.flatten(net.pool("avgpool2d", x, 7, 1))
    net.cross_entropy(net.linear(x, 512, 1000), 1000)
    return net


def _resnet18_cifar(batch_size: int) -> LayerList:
    """CIFAR ResNet of the release: every block has a parallel conv3x3 + BN path from its input."""
    net = LayerList()
    x = net.input((batch_size, 3, 32, 32))
    x = net.batchnorm(net.conv2d(x, 3, 16, 3, 1, 1))
    for in_planes, planes, stride in [(16, 16, 1), (16, 16, 1), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1)]:
        relu1 = net.elementwise("relu", net.batchnorm(net.conv2d(x, in_planes, planes, 3, stride, 1)))
        relu2 = net.elementwise("relu", net.batchnorm(net.conv2d(relu1, planes, planes, 3, 1, 1)))
        bn3 = net.batchnorm(net.conv2d(x, in_planes, planes, 3, stride, 1))
        x = net.elementwise("relu", net.skip_add(relu2, bn3))
    x = net.flatten(net.pool("avgpool2d", x, 8, 1))
    net.cross_entropy(net.linear(x, 64, 10), 10)
    return net


def _resnet50(batch_size: int) -> LayerList:
    """ImageNet ResNet-50 as the release builds it: the skip adds the block's first ReLU to its last BN
    (zero-padded to the wider shape, as the paper's section 3.3 assumes)."""
    net = LayerList()
    x = net.input((batch_size, 3, 224, 224))
    x = net.batchnorm(net.conv2d(x, 3, 64, 7, 2, 3))
    x = net.pool("maxpool2d", x, 3, 2)
    in_planes = 64
    for width, out_planes, blocks in [(64, 256, 3), (128, 512, 4), (256, 1024, 6), (512, 2048, 3)]:
        for block in range(blocks):
            stride = 2 if block == 0 and width != 64 else 1
            relu1 = net.elementwise("relu", net.batchnorm(net.conv2d(x, in_planes, width, 1, stride, 0)))
            relu2 = net.elementwise("relu", net.batchnorm(net.conv2d(relu1, width, width, 3, 1, 1)))
            bn3 = net.batchnorm(net.conv2d(relu2, width, out_planes, 1, 1, 0))
            x = net.elementwise("relu", net.skip_add(bn3, relu1))
            in_planes = out_planes
    x = net.flatten(net.pool("avgpool2d", x, 7, 1))
    net.cross_entropy(net.linear(x, 2048, 1000), 1000)
    return net


def _bert(n_blocks: int, seq: int = 512, hidden: int = 768, head_dim: int = 64, heads: int = 12) -> LayerList:
    net = LayerList()
    x = net.input((seq, hidden))
    for _ in range(n_blocks):
        block_input = x
        x = net.qkv(x, seq, hidden, head_dim, heads)
        x = net.qk_t(x, seq, head_dim, heads)
        x = net.qk_t_v(x, seq, head_dim, heads)
        x = net.linear(x, head_dim * heads, hidden)
        attention = net.skip_add(block_input, x)
        x = net.linear(attention, hidden, 4 * hidden, relu=True)
        x = net.linear(x, 4 * hidden, hidden)
        x = net.skip_add(attention, x)
    net.cross_entropy(x, seq)
    return net


@dataclass(frozen=True)
class PaperModel:
    """A model of the release: its builder and whether it has a batch dimension."""

    description: str
    build: Callable[[int], LayerList]
    batched: bool = True


PAPER_MODELS = MappingProxyType(
    {
        "linear": PaperModel("6-layer MLP on 784 inputs (MNIST-sized)", _linear),
        "vgg16": PaperModel("VGG-16, ImageNet 3x224x224, 1000 classes", lambda b: _vgg16(b, 1000, (3, 224, 224))),
        "vgg16_cifar": PaperModel("VGG-16, CIFAR 3x32x32, 10 classes", lambda b: _vgg16(b, 10, (3, 32, 32))),
        "resnet18": PaperModel("ResNet-18, ImageNet 3x224x224, 1000 classes", _resnet18),
        "resnet18_cifar": PaperModel("the release's CIFAR ResNet (6 blocks of 10 layers), 3x32x32, 10 classes", _resnet18_cifar),
        "resnet50": PaperModel("ResNet-50, ImageNet 3x224x224, 1000 classes", _resnet50),
        "bert": PaperModel("BERT-base: 12 blocks, seq 512, hidden 768, 12 heads of 64", lambda b: _bert(12), batched=False),
        "transformer": PaperModel("one BERT-base block, seq 512, hidden 768", lambda b: _bert(1), batched=False),
        # a short sequence: the longest power of two whose smallest footprint (245,760 B) fits the nRF52840's 256 KiB
        "bert_seq8": PaperModel("BERT-base: 12 blocks, seq 8, hidden 768, 12 heads of 64", lambda b: _bert(12, seq=8), batched=False),
    }
)


#: The largest batch size poetlab builds a graph for: far above any on-device training step, and low enough
#: that sizes and flop counts stay exact in int64 and float64.
MAX_BATCH_SIZE = 65_536


def check_batch_size(batch_size: object) -> int:
    """``batch_size`` if it is a whole number from 1 to :data:`MAX_BATCH_SIZE`, else InvalidArgumentError."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidArgumentError(f"batch size must be a positive integer up to {MAX_BATCH_SIZE}, got {batch_size!r}")
    return batch_size


def build_paper_graph(model: str, batch_size: int = 1) -> TrainingGraph:
    """The training graph of one of the release's models, in the release's layer order."""
    if model not in PAPER_MODELS:
        raise UnknownNameError("model", model, PAPER_MODELS)
    check_batch_size(batch_size)
    spec = PAPER_MODELS[model]
    if not spec.batched and batch_size != 1:
        raise InvalidArgumentError(
            f"model {model!r} has no batch dimension in the release (its input is one (seq, hidden) sequence); use batch size 1"
        )
    metadata: dict[str, object] = {"source": "paper", "model": model, "batch_size": batch_size, "description": spec.description}
    return training_graph(model, spec.build(batch_size), metadata)


def conv_chain_graph(channels: int = 8, side: int = 8, depth: int = 3) -> TrainingGraph:
    """Not a paper model: input -> (conv 3x3 -> ReLU) * depth -> flatten -> loss with the release's layer
    formulas, small enough for MILPs that solve to optimality in seconds (tests, demonstrations)."""
    net = LayerList()
    x = net.input((1, channels, side, side))
    for _ in range(depth):
        x = net.elementwise("relu", net.conv2d(x, channels, channels, 3, 1, 1))
    net.cross_entropy(net.flatten(x), 4)
    return training_graph("conv_chain", net, {"source": "poetlab.core.paper_models.conv_chain_graph"})

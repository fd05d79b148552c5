"""Small real training graphs for solver tests, built with the paper's layer formulas."""

from __future__ import annotations

from poetlab.core.graph import TrainingGraph
from poetlab.core.paper_models import LayerList, conv_chain_graph, training_graph


def mlp(widths: tuple[int, ...] = (8, 16, 4), batch: int = 1) -> TrainingGraph:
    """input -> (Linear -> ReLU) * n -> loss: a chain."""
    net = LayerList()
    x = net.input((batch, widths[0]))
    for a, b in zip(widths[:-1], widths[1:]):
        x = net.elementwise("relu", net.linear(x, a, b))
    net.cross_entropy(x, widths[-1])
    return training_graph("mlp", net, {"source": "test"})


def residual(channels: int = 2, side: int = 4) -> TrainingGraph:
    """input -> conv -> relu -> conv -> skip(relu, conv) -> loss: a branch in the forward graph."""
    net = LayerList()
    x = net.input((1, channels, side, side))
    a = net.elementwise("relu", net.conv2d(x, channels, channels, 3, 1, 1))
    b = net.conv2d(a, channels, channels, 3, 1, 1)
    net.cross_entropy(net.flatten(net.skip_add(a, b)), 4)
    return training_graph("residual", net, {"source": "test"})



def convnet(channels: int = 8, side: int = 8, depth: int = 3) -> TrainingGraph:
    """input -> (conv 3x3 -> ReLU) * depth -> flatten -> loss: a chain of convolutions."""
    return conv_chain_graph(channels, side, depth)


def relu_chain(n: int) -> TrainingGraph:
    """input -> n ReLUs -> loss: a chain of n + 1 steps of equal size."""
    net = LayerList()
    x = net.input((1, 16))
    for _ in range(n):
        x = net.elementwise("relu", x)
    net.cross_entropy(x, 16)
    return training_graph(f"chain{n}", net, {})


def tiny_bert(blocks: int = 2, seq: int = 4, hidden: int = 8, head_dim: int = 4, heads: int = 2) -> TrainingGraph:
    """BERT's blocks (qkv, scores, attention, linear, skip-add, linear+ReLU, linear, skip-add) at toy sizes: a chain
    of skip-adds whose rebuilds in the backward pass run through the attention."""
    net = LayerList()
    x = net.input((seq, hidden))
    for _ in range(blocks):
        block_input = x
        x = net.qk_t_v(net.qk_t(net.qkv(x, seq, hidden, head_dim, heads), seq, head_dim, heads), seq, head_dim, heads)
        attention = net.skip_add(block_input, net.linear(x, head_dim * heads, hidden))
        x = net.skip_add(attention, net.linear(net.linear(attention, hidden, 4 * hidden, relu=True), 4 * hidden, hidden))
    net.cross_entropy(x, seq)
    return training_graph(f"tiny_bert{blocks}", net, {"source": "test"})

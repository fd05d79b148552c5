"""A two-layer transformer encoder built on ``nn.MultiheadAttention`` (tokens in, mean-pooled class out)."""

import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads, dropout=0.1, batch_first=True)
        self.norm1 = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
        self.norm2 = nn.LayerNorm(width)

    def forward(self, x):
        a, _ = self.attn(x, x, x, need_weights=False)
        x = self.norm1(x + a)
        return self.norm2(x + self.ff(x))


class Encoder(nn.Module):
    def __init__(self, vocab: int = 50, width: int = 32, heads: int = 4, classes: int = 5, layers: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.Sequential(*[Layer(width, heads) for _ in range(layers)])
        self.head = nn.Linear(width, classes)

    def forward(self, tokens):
        return self.head(self.layers(self.embed(tokens)).mean(dim=1))


def make(batch_size: int = 4):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return Encoder().train(), torch.randint(50, (batch_size, 16), generator=g), torch.randint(5, (batch_size,), generator=g), nn.CrossEntropyLoss()

"""A module called twice: one shared residual MLP block applied two times (weights shared across depth), after a
two-layer stem."""

import torch
from torch import nn


class Shared(nn.Module):
    def __init__(self, width: int = 64, classes: int = 4):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width))
        self.block = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Dropout(0.1))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        x = x + self.block(x)
        return self.head(x)


def make(batch_size: int = 32):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return Shared().train(), torch.randn(batch_size, 32, generator=g), torch.randint(4, (batch_size,), generator=g), nn.CrossEntropyLoss()

"""A sequence classifier: a linear embedding, a GRU (one node: torch's recurrent modules are leaves of the
trace), and a head on the last hidden state."""

import torch
from torch import nn


class GRUClassifier(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 24, classes: int = 3):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.Tanh())
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, h = self.gru(self.embed(x))
        return self.head(out[:, -1] + h[0])


def make(batch_size: int = 4):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return GRUClassifier().train(), torch.randn(batch_size, 10, 8, generator=g), torch.randint(3, (batch_size,), generator=g), nn.CrossEntropyLoss()

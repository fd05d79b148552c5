"""An autoencoder whose decoder reuses the encoder's weight transposed (weight tying through ``F.linear``),
after a feature layer whose activations a planner can recompute or page while the decoder's backward runs."""

import torch
from torch import nn
from torch.nn import functional as F


class TiedAutoencoder(nn.Module):
    def __init__(self, features: int = 128, hidden: int = 32):
        super().__init__()
        self.features = nn.Sequential(nn.Linear(features, features), nn.Tanh(), nn.Linear(features, features), nn.Tanh())
        self.encoder = nn.Linear(features, hidden)
        self.decoder_bias = nn.Parameter(torch.zeros(features))

    def forward(self, x):
        h = torch.tanh(self.encoder(self.features(x)))
        return F.linear(h, self.encoder.weight.t(), self.decoder_bias)


def make(batch_size: int = 32):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch_size, 128, generator=g)
    return TiedAutoencoder().train(), x, x.clone(), nn.MSELoss()

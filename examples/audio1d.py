"""A keyword-spotting style Conv1d model on raw audio (strided 1-d convolutions, BatchNorm1d, in-place ReLU)."""

import torch
from torch import nn


class AudioNet(nn.Module):
    def __init__(self, classes: int = 8):
        super().__init__()
        layers = []
        channels = [1, 8, 16, 16, 32]
        for cin, cout in zip(channels, channels[1:]):
            layers += [nn.Conv1d(cin, cout, 9, stride=2, padding=4), nn.BatchNorm1d(cout), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(32, classes)

    def forward(self, wave):
        return self.head(torch.flatten(self.pool(self.features(wave)), 1))


def make(batch_size: int = 2):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return AudioNet().train(), torch.randn(batch_size, 1, 1024, generator=g), torch.randint(8, (batch_size,), generator=g), nn.CrossEntropyLoss()

"""A MobileNet-like stack of depthwise-separable convolutions with GroupNorm and SiLU."""

import torch
from torch import nn


def _separable(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False), nn.GroupNorm(4, cin), nn.SiLU(),
        nn.Conv2d(cin, cout, 1, bias=False), nn.GroupNorm(4, cout), nn.SiLU(),
    )


class DepthwiseNet(nn.Module):
    def __init__(self, classes: int = 5):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.body = nn.Sequential(_separable(16, 16, 1), _separable(16, 32, 2), _separable(32, 32, 1))
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).mean(dim=(2, 3)))


def make(batch_size: int = 2):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return DepthwiseNet().train(), torch.randn(batch_size, 3, 16, 16, generator=g), torch.randint(5, (batch_size,), generator=g), nn.CrossEntropyLoss()

"""A small U-Net (two levels, in-place ReLU, skip connections by concatenation) on 1x32x32 images, segmentation loss."""

import torch
from torch import nn


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    def __init__(self, width: int = 8, classes: int = 3):
        super().__init__()
        self.down1 = _block(1, width)
        self.down2 = _block(width, 2 * width)
        self.pool = nn.MaxPool2d(2)
        self.bottom = _block(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = _block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = _block(2 * width, width)
        self.head = nn.Conv2d(width, classes, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(self.pool(d1))
        b = self.bottom(self.pool(d2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], dim=1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], dim=1))
        return self.head(u1)


def make(batch_size: int = 2):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    inputs = torch.randn(batch_size, 1, 32, 32, generator=g)
    targets = torch.randint(3, (batch_size, 32, 32), generator=g)
    return UNet().train(), inputs, targets, nn.CrossEntropyLoss()

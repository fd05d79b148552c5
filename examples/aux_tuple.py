"""A CNN with a tuple output (main logits, auxiliary logits from a middle layer) and a loss that adds the
auxiliary loss at weight 0.3, as Inception's training does."""

import torch
from torch import nn
from torch.nn import functional as F


class AuxNet(nn.Module):
    def __init__(self, classes: int = 6):
        super().__init__()
        self.stage1 = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        )
        self.stage2 = nn.Sequential(
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        )
        self.aux = nn.Linear(8, classes)
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        a = self.stage1(x)
        b = self.stage2(a)
        return self.head(b.mean(dim=(2, 3))), self.aux(a.mean(dim=(2, 3)))


def loss_fn(outputs, targets):
    main, aux = outputs
    return F.cross_entropy(main, targets) + 0.3 * F.cross_entropy(aux, targets)


def make(batch_size: int = 4):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return AuxNet().train(), torch.randn(batch_size, 3, 16, 16, generator=g), torch.randint(6, (batch_size,), generator=g), loss_fn

"""A small ConvNet mixing convolutions spio can and cannot run (shared by the transform tests)."""

import torch
from torch import nn


class SubclassConv(nn.Conv2d):
    """An nn.Conv2d subclass: transform must leave it alone even though its shape is eligible."""


class MixedConvNet(nn.Module):
    """Eligible: gw8 3x3, 5x5 padding='same', 1x3 without bias, and a conv used twice (shared).

    Ineligible: stride 2, group width 4, 7x7, padding_mode reflect, a subclass, a dense 1x1.
    The forward has data-dependent control flow, so FX could not trace it.
    """

    ELIGIBLE = 4

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        shared = nn.Conv2d(c, c, 3, padding=1, groups=c // 8)
        self.stem = nn.Conv2d(3, c, 1)
        self.blocks = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, groups=c // 8),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.Conv2d(c, c, 5, padding="same", groups=c // 8),
            nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c // 8),
            nn.Conv2d(c, c, 3, padding=1, groups=c // 4),
        )
        self.heads = nn.ModuleDict(
            {
                "wide": nn.Conv2d(c, c, 7, padding=3, groups=c // 8),
                "reflect": nn.Conv2d(c, c, 3, padding=1, groups=c // 8, padding_mode="reflect"),
                "sub": SubclassConv(c, c, 3, padding=1, groups=c // 8),
                "row": nn.Conv2d(c, c, (1, 3), padding=(0, 1), groups=c // 8, bias=False),
            }
        )
        self.shared_a = shared
        self.shared_b = shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        for head in self.heads.values():
            x = x + head(x)
        x = self.shared_a(x)
        if x.sum() > 0:  # data-dependent: not FX-traceable
            x = self.shared_b(x)
        return x.mean(dim=(2, 3))

"""HeteroFL's PreResNet-18 (Diao et al., ICLR 2021, Table 6; public code `models/resnet.py`).

Stem 3x3 conv (no bias, no norm after it); four stages of two pre-activation basic blocks,
widths [64, 128, 256, 512] * rate and strides [1, 2, 2, 2]. A block computes
t = ReLU(n1(Scaler(x))); shortcut = Conv1x1(t) when the stride or width changes, else x;
out = conv2(ReLU(n2(Scaler(conv1(t))))) + shortcut. Head: ReLU(n4(Scaler(x))) -> global
average pool -> linear. No conv bias; norm gamma = 1, beta = 0, linear bias = 0 at init.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import ScaledConfig, Scaler, make_norm, require_input, scaled
from .registry import register

HIDDEN = (64, 128, 256, 512)
STRIDES = (1, 2, 2, 2)


class PreResNetConfig(ScaledConfig):
    name: str = "preresnet18"


class Block(nn.Module):
    """A pre-activation basic block over `dims` spatial dimensions (2: images, 1: sequences)."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str, scaler: float, dims: int = 2):
        super().__init__()
        conv = {1: nn.Conv1d, 2: nn.Conv2d}[dims]
        self.n1 = make_norm(norm, c_in, dims)
        self.conv1 = conv(c_in, c_out, 3, stride, 1, bias=False)
        self.n2 = make_norm(norm, c_out, dims)
        self.conv2 = conv(c_out, c_out, 3, 1, 1, bias=False)
        self.scaler = Scaler(scaler)
        self.shortcut = conv(c_in, c_out, 1, stride, bias=False) if stride != 1 or c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.relu(self.n1(self.scaler(x)))
        shortcut = self.shortcut(t) if self.shortcut is not None else x
        out = self.conv1(t)
        out = self.conv2(torch.relu(self.n2(self.scaler(out))))
        return out + shortcut


class PreResNet(nn.Module):
    def __init__(self, config: PreResNetConfig, in_channels: int, num_classes: int):
        super().__init__()
        widths = [scaled(w, config.rate) for w in HIDDEN]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
        blocks, c_in = [], widths[0]
        for width, stride in zip(widths, STRIDES):
            for s in (stride, 1):
                blocks.append(Block(c_in, width, s, config.norm, config.scaler))
                c_in = width
        self.layers = nn.Sequential(*blocks)
        self.n4 = make_norm(config.norm, c_in, 2)
        self.scaler = Scaler(config.scaler)
        self.linear = nn.Linear(c_in, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)) and m.weight is not None:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.conv1(x))
        out = torch.relu(self.n4(self.scaler(out)))
        return self.linear(out.mean(dim=(2, 3)))


@register("preresnet18", PreResNetConfig, "HeteroFL PreResNet-18: 4 stages x 2 pre-activation blocks [64..512]*rate")
def build_preresnet18(config: PreResNetConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    require_input("preresnet18", input_shape, 3, "image (C, H, W)")
    return PreResNet(config, input_shape[0], num_classes)

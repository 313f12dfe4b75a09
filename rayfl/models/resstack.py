"""A residual convolution stack for sequences (C, L) and images (C, H, W), depth- and width-scalable.

Stem: a 3-tap (3x3) convolution to `width` channels, Scaler, norm, ReLU. Then `depth` residual
blocks of one shape, `layers.<i>.`: conv -> Scaler -> norm -> ReLU -> conv -> Scaler -> norm,
added to the block's input, then ReLU. Head: global average pool and a linear classifier. So a
stack of depth L is the first L blocks of a deeper one (InclusiveFL's depth groups), and `rate`
scales every width (HeteroFL's leading-block sub-models).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from ..config import ConfigError
from .layers import DepthConfig, Norm, ScaledConfig, Scaler, make_norm, scaled
from .registry import register


class ResStackConfig(ScaledConfig, DepthConfig):
    name: str = "resstack"
    width: int = Field(32, ge=1, description="channels at rate 1")
    norm: Norm = "gn"


class Block(nn.Module):
    def __init__(self, conv, width: int, norm: str, dims: int, scaler: float):
        super().__init__()
        self.conv1, self.conv2 = conv(width, width, 3, padding=1), conv(width, width, 3, padding=1)
        self.n1, self.n2 = make_norm(norm, width, dims), make_norm(norm, width, dims)
        self.scaler = Scaler(scaler)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.n1(self.scaler(self.conv1(x))))
        return torch.relu(x + self.n2(self.scaler(self.conv2(h))))


class Head(nn.Module):
    def __init__(self, width: int, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(2).mean(2))


class ResStack(nn.Module):
    def __init__(self, config: ResStackConfig, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        dims = len(input_shape) - 1
        conv = {1: nn.Conv1d, 2: nn.Conv2d}[dims]
        width = scaled(config.width, config.rate)
        self.stem = nn.Sequential(
            conv(input_shape[0], width, 3, padding=1),
            Scaler(config.scaler),
            make_norm(config.norm, width, dims),
            nn.ReLU(),
        )
        self.layers = nn.Sequential(
            *(Block(conv, width, config.norm, dims, config.scaler) for _ in range(config.depth))
        )
        self.head = Head(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)))


@register(
    "resstack",
    ResStackConfig,
    "Residual conv stack: stem -> depth x residual blocks (width) -> pool -> linear, sequences or images; depth- "
    "and width-scalable",
)
def build_resstack(config: ResStackConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) not in (2, 3):
        raise ConfigError(
            f"model.name: resstack needs a sequence (C, L) or an image (C, H, W), the dataset gives {input_shape}"
        )
    return ResStack(config, input_shape, num_classes)

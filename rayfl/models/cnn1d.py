"""A 1-D CNN for MNIST-1D (Greydanus, 2020: three strided conv layers then a linear head)."""

from __future__ import annotations

from pydantic import Field
from torch import nn

from rayfl.config import ConfigError, ModelConfig
from rayfl.models.layers import Norm, Scaler, make_norm, scaled
from rayfl.models.registry import register


class Cnn1dConfig(ModelConfig):
    name: str = "cnn1d"
    channels: int = Field(32, ge=1, description="conv channels at rate 1")
    rate: float = Field(1.0, gt=0, le=1, description="width rate r: channels ceil(r * channels)")
    norm: Norm = "bn"
    scaler: float = Field(1.0, gt=0, le=1, description="Scaler rate: the width relative to the global model")


@register("cnn1d", Cnn1dConfig, "1-D CNN: 3 conv(k5, s2) blocks * rate + linear, sequence input (C,L)")
def build_cnn1d(config: Cnn1dConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 2:
        raise ConfigError(f"model.name: cnn1d needs sequence input (C, L), the dataset gives {input_shape}")
    width = scaled(config.channels, config.rate)
    channels, length = input_shape
    layers: list[nn.Module] = []
    for _ in range(3):
        layers += [nn.Conv1d(channels, width, 5, 2, 2), Scaler(config.scaler), make_norm(config.norm, width, 1), nn.ReLU()]
        channels, length = width, (length - 1) // 2 + 1
    layers += [nn.Flatten(), nn.Linear(channels * length, num_classes)]
    return nn.Sequential(*layers)

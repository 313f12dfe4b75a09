"""FedAvg's CNN (McMahan et al., AISTATS 2017, Sec. 3): two 5x5 conv layers (32, 64 channels),
each followed by 2x2 max-pooling, a 512-unit fully connected layer and a linear classifier.
Convolutions keep the spatial size ("same" padding), so it fits 8x8 digits as well as 28x28 MNIST.
"""

from __future__ import annotations

from pydantic import Field
from torch import nn

from rayfl.config import ConfigError, ModelConfig
from rayfl.models.layers import scaled
from rayfl.models.registry import register


class Cnn2Config(ModelConfig):
    name: str = "cnn2"
    rate: float = Field(1.0, gt=0, le=1, description="width rate r: channels ceil(r * [32, 64]), hidden ceil(r * 512)")


@register("cnn2", Cnn2Config, "FedAvg's CNN: 2 conv(5x5) [32,64]*rate + pool, fc 512*rate, image input (C,H,W)")
def build_cnn2(config: Cnn2Config, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 3:
        raise ConfigError(f"model.name: cnn2 needs image input (C, H, W), the dataset gives {input_shape}")
    c1, c2, hidden = scaled(32, config.rate), scaled(64, config.rate), scaled(512, config.rate)
    channels, h, w = input_shape
    flat = c2 * (h // 4) * (w // 4)
    return nn.Sequential(
        nn.Conv2d(channels, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
    )

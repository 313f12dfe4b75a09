"""A 1-D CNN for MNIST-1D (Greydanus, 2020: three strided conv layers then a linear head).
For split learning it cuts after its first two convolutions by default (`split_layer: 2`): the
worker's bottom gives 32 x 10 features on MNIST-1D's length 40, the server's top is the third
convolution block (with its normalization) and the classifier.
"""

from __future__ import annotations

from pydantic import Field
from torch import nn

from .layers import ScaledConfig, Scaler, SplitConfig, make_norm, require_input, scaled
from .registry import register


class Cnn1dConfig(ScaledConfig, SplitConfig):
    name: str = "cnn1d"
    split_layer: int = 2
    channels: int = Field(32, ge=1, description="conv channels at rate 1")


@register(
    "cnn1d", Cnn1dConfig, "1-D CNN: 3 conv(k5, s2) blocks * rate + linear, sequence input (C,L); split after 2 convs"
)
def build_cnn1d(config: Cnn1dConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    require_input("cnn1d", input_shape, 2, "sequence (C, L)")
    width = scaled(config.channels, config.rate)
    channels, length = input_shape
    layers: list[nn.Module] = []
    for _ in range(3):
        layers += [
            nn.Conv1d(channels, width, 5, 2, 2),
            Scaler(config.scaler),
            make_norm(config.norm, width, 1),
            nn.ReLU(),
        ]
        channels, length = width, (length - 1) // 2 + 1
    layers += [nn.Flatten(), nn.Linear(channels * length, num_classes)]
    return nn.Sequential(*layers)

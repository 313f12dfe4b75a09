"""FedAvg's CNN (McMahan et al., AISTATS 2017, Sec. 3): two 5x5 conv layers (32, 64 channels),
each followed by 2x2 max-pooling, a 512-unit fully connected layer and a linear classifier.
Convolutions keep the spatial size ("same" padding), so it fits 8x8 digits as well as 28x28 MNIST.
For split learning it cuts after its two convolutions by default (`split_layer: 2`).
"""

from __future__ import annotations

from torch import nn

from .layers import SplitConfig, WidthConfig, require_input, scaled
from .registry import register


class Cnn2Config(WidthConfig, SplitConfig):
    name: str = "cnn2"
    split_layer: int = 2


@register("cnn2", Cnn2Config, "FedAvg's CNN: 2 conv(5x5) [32,64]*rate + pool, fc 512*rate, image input (C,H,W)")
def build_cnn2(config: Cnn2Config, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    require_input("cnn2", input_shape, 3, "image (C, H, W)")
    c1, c2, hidden = scaled(32, config.rate), scaled(64, config.rate), scaled(512, config.rate)
    channels, h, w = input_shape
    flat = c2 * (h // 4) * (w // 4)
    return nn.Sequential(
        nn.Conv2d(channels, c1, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )

"""pfl-research's CIFAR-10 CNN (Granqvist et al., "pfl-research: simulation framework for
accelerating research in Private Federated Learning", NeurIPS 2024 Datasets and Benchmarks;
its benchmarks' `simple_cnn`): two 3x3 convolutions without padding (32, 64 channels), 2x2
max-pooling, dropout 0.25, a 128-unit fully connected layer, dropout 0.5 and a linear
classifier; Glorot-uniform weights, as its TF2 twin. The model of its CIFAR-10 setting (1000
users of 50 images, a cohort of 50, batch 10), which `bench/gpu_scale.py` measures rayfl on.
"""

from __future__ import annotations

from torch import nn

from .layers import WidthConfig, require_input, scaled
from .registry import register


class CnnPflConfig(WidthConfig):
    name: str = "cnn_pfl"


@register(
    "cnn_pfl",
    CnnPflConfig,
    "pfl-research's CIFAR-10 CNN: 2 conv(3x3) [32,64]*rate + pool + dropout, fc 128*rate + dropout",
)
def build_cnn_pfl(config: CnnPflConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    require_input("cnn_pfl", input_shape, 3, "image (C, H, W)")
    channels, h, w = input_shape
    c1, c2, hidden = scaled(32, config.rate), scaled(64, config.rate), scaled(128, config.rate)
    model = nn.Sequential(
        nn.Conv2d(channels, c1, 3),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(c2 * ((h - 4) // 2) * ((w - 4) // 2), hidden),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(hidden, num_classes),
    )
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
    return model

"""HeteroFL's CNN (Diao et al., ICLR 2021, Table 6; public code `models/conv.py`).

Four 3x3 conv blocks with widths [64, 128, 256, 512] * rate: conv (with bias) -> Scaler ->
norm -> ReLU -> 2x2 max-pool, the last block without the pool; then global average pool
and a linear classifier.
"""

from __future__ import annotations

from torch import nn

from .layers import ScaledConfig, Scaler, make_norm, require_input, scaled
from .registry import register

HIDDEN = (64, 128, 256, 512)


class CnnConfig(ScaledConfig):
    name: str = "cnn"


@register("cnn", CnnConfig, "HeteroFL CNN: 4 conv blocks [64,128,256,512]*rate, image input (C,H,W)")
def build_cnn(config: CnnConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    require_input("cnn", input_shape, 3, "image (C, H, W)")
    widths = [scaled(w, config.rate) for w in HIDDEN]
    layers: list[nn.Module] = []
    channels = input_shape[0]
    for i, width in enumerate(widths):
        layers += [
            nn.Conv2d(channels, width, 3, 1, 1),
            Scaler(config.scaler),
            make_norm(config.norm, width, dims=2),
            nn.ReLU(inplace=True),
        ]
        if i < len(widths) - 1:
            layers.append(nn.MaxPool2d(2))
        channels = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)]
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)) and m.weight is not None:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)
    return model

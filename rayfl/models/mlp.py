"""A multilayer perceptron for flat or small inputs (`synthetic`, `digits`, `mnist1d`)."""

from __future__ import annotations

import math

from pydantic import Field
from torch import nn

from .layers import Norm, ScaledConfig, Scaler, make_norm, scaled
from .registry import register


class MlpConfig(ScaledConfig):
    name: str = "mlp"
    hidden: tuple[int, ...] = Field((200, 200), description="hidden sizes at rate 1")
    norm: Norm = "none"


@register("mlp", MlpConfig, "MLP: flatten -> [Linear -> Scaler -> norm -> ReLU]* -> Linear, any input")
def build_mlp(config: MlpConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    features = math.prod(input_shape)
    for width in (scaled(h, config.rate) for h in config.hidden):
        layers += [nn.Linear(features, width), Scaler(config.scaler), make_norm(config.norm, width, dims=0), nn.ReLU()]
        features = width
    layers.append(nn.Linear(features, num_classes))
    return nn.Sequential(*layers)

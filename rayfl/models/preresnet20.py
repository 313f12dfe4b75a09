"""PreResNet-20 as FeDepth defines it (Zhang et al. 2023; public code
`preresnet_res_light.resnet20`, docs/papers.md, FeDepth: public code, PreResNet-20),
width-slimmable and depth-sliceable.

Stem: a 3-tap conv (3x3 on images) to 16r channels and a norm, with no ReLU after it. Then nine
single-block layers `layers.<i>` of pre-activation basic blocks (`preresnet.Block`): widths
16, 16, 16, 32, 32, 32, 64, 64, 64 (times the width rate r), strides 1, 1, 1, 2, 1, 1, 2, 1, 1.
Head `head.`, shared by every depth: norm -> ReLU -> global average pool -> linear.
`depth` keeps the first layers only: a prefix model, whose head stands for the full model's
auxiliary classifier at its last layer (so without the ReLU; DepthFL's local models).

What depth-wise training needs:
- `link(z)`: FeDepth's parameter-free skip from any layer's output to the head's input shape:
  strided spatial subsampling (x[..., ::s]; picking, not pooling) and symmetric zero-padding of
  the channels, so the real features sit in the middle channels (link1 / link2 of the code);
- `enter(x, skip)`: the stem, linked to the input shape of layer `skip` (partial training skips
  the first layers; `link3` of the code's insufficient variant);
- `aux.<i>`: auxiliary classifiers after the 1-based layers in `aux_heads` (m-FeDepth's heads,
  norm -> global average pool -> linear, without the ReLU of the code), `exit(z, i, aux)` picks
  a layer's classifier.
Batch norm defaults to batch statistics in training and test (`norm: sbn`), as the published
runs' `--no_track_stat`. Works on images (C, H, W) of any size and on sequences (C, L): the same
layers with 1-D convolutions (digits' 8x8 images and MNIST-1D's 40-step signals).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from .layers import Norm, ScaledConfig, Scaler, make_norm, require_input, scaled
from .preresnet import Block
from .registry import register

HIDDEN = (16, 16, 16, 32, 32, 32, 64, 64, 64)
STRIDES = (1, 1, 1, 2, 1, 1, 2, 1, 1)


class PreResNet20Config(ScaledConfig):
    name: str = "preresnet20"
    norm: Norm = "sbn"
    aux_heads: str = Field(
        "",
        pattern=r"^(\d+(-\d+)*)?$",
        description="1-based layers followed by an auxiliary classifier, e.g. 1-2-3-4-6 (m-FeDepth)",
    )
    depth: int = Field(9, ge=1, le=9, description="layers kept (a prefix of the nine; the head follows the last)")

    def aux_layers(self) -> tuple[int, ...]:
        """0-based indices of the layers with an auxiliary classifier."""
        return (
            tuple(sorted({int(i) - 1 for i in self.aux_heads.split("-")} & set(range(self.depth - 1))))
            if self.aux_heads
            else ()
        )


class Stem(nn.Module):
    def __init__(self, conv, c_in: int, c_out: int, norm: str, dims: int, scaler: float):
        super().__init__()
        self.conv = conv(c_in, c_out, 3, 1, 1, bias=False)
        self.norm = make_norm(norm, c_out, dims)
        self.scaler = Scaler(scaler)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.scaler(self.conv(x)))


class Classifier(nn.Module):
    """norm -> (ReLU) -> global average pool -> linear."""

    def __init__(self, width: int, num_classes: int, norm: str, dims: int, scaler: float, relu: bool):
        super().__init__()
        self.norm = make_norm(norm, width, dims)
        self.scaler = Scaler(scaler)
        self.linear = nn.Linear(width, num_classes)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.scaler(x))
        if self.relu:
            x = torch.relu(x)
        return self.linear(x.flatten(2).mean(2))


def link(z: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """FeDepth's skip link: `z` (N, C, *S) to `shape` (C', *S') with C <= C', by picking every
    s-th position (s = S / S', rounded) and zero-padding the channels on both sides,
    floor((C' - C) / 2) before the real ones."""
    channels, spatial = shape[0], shape[1:]
    steps = [max(1, round(have / want)) for have, want in zip(z.shape[2:], spatial)]
    z = z[(slice(None), slice(None), *(slice(None, None, s) for s in steps))]
    if tuple(z.shape[2:]) != tuple(spatial):
        raise ValueError(f"link: cannot subsample {tuple(z.shape[1:])} to {shape}")
    pad = channels - z.shape[1]
    if pad < 0:
        raise ValueError(f"link: {z.shape[1]} channels do not fit in {channels}")
    return F.pad(z, (0, 0) * len(spatial) + (pad // 2, pad - pad // 2)) if pad else z


class PreResNet20(nn.Module):
    def __init__(self, config: PreResNet20Config, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        dims = len(input_shape) - 1
        conv = {1: nn.Conv1d, 2: nn.Conv2d}[dims]
        widths = [scaled(w, config.rate) for w in HIDDEN]
        self.stem = Stem(conv, input_shape[0], widths[0], config.norm, dims, config.scaler)
        layers, c_in, size = [], widths[0], tuple(input_shape[1:])
        self.shapes: list[tuple[int, ...]] = []
        """(channels, *spatial) after each layer; the stem gives layer 0's input shape."""
        self.stem_shape = (widths[0], *size)
        for width, stride in zip(widths[: config.depth], STRIDES):
            layers.append(Block(c_in, width, stride, config.norm, config.scaler, dims))
            c_in, size = width, tuple(math.ceil(s / stride) for s in size)
            self.shapes.append((width, *size))
        self.layers = nn.ModuleList(layers)
        self.head = Classifier(c_in, num_classes, config.norm, dims, config.scaler, relu=config.depth == len(HIDDEN))
        self.aux = nn.ModuleDict(
            {
                str(i): Classifier(self.shapes[i][0], num_classes, config.norm, dims, config.scaler, relu=False)
                for i in config.aux_layers()
            }
        )
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def input_shape_of(self, i: int) -> tuple[int, ...]:
        return self.stem_shape if i == 0 else self.shapes[i - 1]

    def enter(self, x: torch.Tensor, skip: int = 0) -> torch.Tensor:
        """The stem's output as the input of layer `skip` (partial training skips the layers before it)."""
        z = self.stem(x)
        return z if skip == 0 else link(z, self.input_shape_of(skip))

    def exit(self, z: torch.Tensor, i: int, aux: bool = False) -> torch.Tensor:
        """Logits from layer i's output: the head (after the last layer), layer i's auxiliary
        classifier (`aux`), or the shared head through the skip link."""
        if i == len(self.layers) - 1:
            return self.head(z)
        if aux:
            return self.aux[str(i)](z)
        return self.head(link(z, self.shapes[-1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.stem(x)
        for layer in self.layers:
            z = layer(z)
        return self.head(z)


@register(
    "preresnet20",
    PreResNet20Config,
    "FeDepth PreResNet-20: stem + 9 pre-activation blocks [16x3, 32x3, 64x3]*rate, shared head, skip links",
)
def build_preresnet20(config: PreResNet20Config, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) not in (2, 3):
        require_input("preresnet20", input_shape, 3, "image (C, H, W) or sequence (C, L)")
    return PreResNet20(config, input_shape, num_classes)

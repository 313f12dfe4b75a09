"""FedSup's MobileNetV1-style supernet (Kim & Yun, "Supernet Training for Federated Image
Classification under System Heterogeneity", Table 5; public code `Kthyeon/FedSup`,
docs/papers.md, FedSup: public code, search space), with elastic width, depth and kernel size
in every stage.

Stem: a 3-tap conv (3x3 on images) to `stem` channels with stride `stem_stride`, a norm, ReLU.
Stages of depthwise-separable blocks (expand ratio 1): depthwise k-tap conv (the stage's stride
on its first block) -> norm -> ReLU -> pointwise 1x1 -> norm, plus a residual shortcut: identity
when channels and stride stay, else average pooling by the stride and a 1x1 conv when the
channels change; the last norm's scale of every block starts at 0. Head: global average pool ->
dropout -> linear.

A sub-net (`Subnet`: a width, depth and kernel per stage, each one of the stage's choices) takes
the first channels of every tensor, the first blocks of each stage and the centre crop of each
kernel (OFA-style weight sharing, no kernel transform); `set_active` picks it, `Subnet.config`
gives the static model of just that sub-net, whose state is the crop of the supernet's (`crop`).
Every stage is elastic; the code's off-by-one that freezes the last stage at its largest width
and kernel is `elastic_last: false`. Norms: `pn` (parametric normalization, Eq. 4-5, the default),
`sbn`, `bn`, `none`. Images (C, H, W) or sequences (C, L).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..config import ModelConfig
from .registry import register

PN_EPS = 1e-8


class SupernetConfig(ModelConfig):
    name: str = "supernet"
    stem: int = Field(32, ge=1, description="stem channels")
    stem_stride: int = Field(2, ge=1)
    widths: tuple[tuple[int, ...], ...] = Field(
        ((32, 64), (64, 128), (128, 256), (512, 1024)),
        description="width choices per stage (the public code's; Table 5 gives the ranges 32-64, 64-128, 128-256, "
        "256-1024)",
    )
    depths: tuple[tuple[int, ...], ...] = Field(((1,), (1, 2), (1, 2), (1, 2)), description="depth choices per stage")
    kernels: tuple[tuple[int, ...], ...] = Field(((3, 5, 7),) * 4, description="kernel choices per stage (odd)")
    strides: tuple[int, ...] = Field((1, 2, 2, 2), description="stride of each stage's first block")
    norm: Literal["pn", "sbn", "bn", "none"] = Field("pn", description="pn: parametric normalization (FedSup Eq. 4-5)")
    dropout: float = Field(0.0, ge=0, lt=1)
    elastic_last: bool = Field(
        True,
        description="false: sub-nets keep the last stage's largest width and kernel (the public code's off-by-one)",
    )

    @model_validator(mode="after")
    def _stages(self) -> "SupernetConfig":
        n = len(self.widths)
        if not (len(self.depths) == len(self.kernels) == len(self.strides) == n) or n == 0:
            raise ValueError("widths, depths, kernels and strides need one entry per stage")
        if any(k % 2 == 0 for ks in self.kernels for k in ks) or any(
            not c for c in (*self.widths, *self.depths, *self.kernels)
        ):
            raise ValueError("every stage needs choices; kernels must be odd")
        return self


class SupernetSmallConfig(SupernetConfig):
    """The small-input variant (digits' 8x8 images, MNIST-1D's 40 steps): stride-1 stem, a quarter of the widths."""

    name: str = "supernet_small"
    stem: int = 8
    stem_stride: int = 1
    widths: tuple[tuple[int, ...], ...] = ((8, 16), (16, 32), (32, 64), (128, 256))


@dataclass(frozen=True)
class Subnet:
    """One child model: a width, depth and kernel per stage."""

    widths: tuple[int, ...]
    depths: tuple[int, ...]
    kernels: tuple[int, ...]

    @classmethod
    def of(cls, static: SupernetConfig) -> "Subnet":
        """The sub-net a static config (one choice per stage, `config`'s output) stands for."""
        first = lambda choices: tuple(c[0] for c in choices)
        return cls(first(static.widths), first(static.depths), first(static.kernels))

    def config(self, supernet: SupernetConfig) -> SupernetConfig:
        """The static model of this sub-net (its state is `crop` of the supernet's)."""
        single = lambda xs: tuple((x,) for x in xs)
        return supernet.model_copy(
            update={"widths": single(self.widths), "depths": single(self.depths), "kernels": single(self.kernels)}
        )


def frozen_last(config: SupernetConfig, subnet: Subnet) -> Subnet:
    """With `elastic_last: false`, the last stage at its largest width and kernel (the code's bug)."""
    if config.elastic_last:
        return subnet
    return Subnet(
        (*subnet.widths[:-1], max(config.widths[-1])), subnet.depths, (*subnet.kernels[:-1], max(config.kernels[-1]))
    )


def largest(config: SupernetConfig) -> Subnet:
    return Subnet(tuple(map(max, config.widths)), tuple(map(max, config.depths)), tuple(map(max, config.kernels)))


def smallest(config: SupernetConfig) -> Subnet:
    return frozen_last(
        config, Subnet(tuple(map(min, config.widths)), tuple(map(min, config.depths)), tuple(map(min, config.kernels)))
    )


def medium(config: SupernetConfig) -> Subnet:
    """FedSup's "M": the shallowest depth, the largest width, the middle kernel (medium FLOPs)."""
    mid = tuple(sorted(ks)[len(ks) // 2] for ks in config.kernels)
    return frozen_last(config, Subnet(tuple(map(max, config.widths)), tuple(map(min, config.depths)), mid))


def random_subnet(config: SupernetConfig, g: np.random.Generator) -> Subnet:
    """Width, depth and kernel of every stage drawn uniformly from its choices."""
    pick = lambda choices: tuple(int(c[g.integers(len(c))]) for c in choices)
    return frozen_last(config, Subnet(pick(config.widths), pick(config.depths), pick(config.kernels)))


def all_subnets(config: SupernetConfig) -> list[Subnet]:
    per_stage = [list(itertools.product(w, d, k)) for w, d, k in zip(config.widths, config.depths, config.kernels)]
    return [Subnet(*map(tuple, zip(*combo))) for combo in itertools.product(*per_stage)]


def crop(shape: Sequence[int], full: Sequence[int]) -> tuple[slice, ...]:
    """Where a sub-net's tensor of `shape` sits in the supernet's of shape `full`: the first
    entries of the channel dimensions (0 and 1), the centre of the kernel dimensions (2 on)."""
    out = []
    for d, (n, m) in enumerate(zip(shape, full)):
        if n > m or (d >= 2 and (m - n) % 2):
            raise ValueError(f"a sub-net tensor of shape {tuple(shape)} does not fit {tuple(full)}")
        start = (m - n) // 2 if d >= 2 else 0
        out.append(slice(start, start + n))
    return tuple(out)


class ParametricNorm(nn.Module):
    """PN (FedSup Eq. 4-5): x_hat = (x - alpha) / (RMS(x - alpha) + eps), y = gamma x_hat + beta,
    per channel, RMS over the batch and every spatial position; alpha, gamma, beta learned (no
    running statistics). `forward(x)` uses the first x.shape[1] channels' parameters."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        view = (1, c) + (1,) * (x.dim() - 2)
        centred = x - self.alpha[:c].view(view)
        dims = [0, *range(2, x.dim())]
        rms = centred.pow(2).mean(dim=dims, keepdim=True).sqrt()
        return self.weight[:c].view(view) * centred / (rms + PN_EPS) + self.bias[:c].view(view)


class DynamicNorm(nn.Module):
    """A norm over the first channels of its input: pn, sbn (batch statistics only), bn, none."""

    def __init__(self, kind: str, channels: int):
        super().__init__()
        self.kind = kind
        if kind == "pn":
            self.pn = ParametricNorm(channels)
        elif kind in ("sbn", "bn"):
            self.bn = nn.BatchNorm1d(channels, track_running_stats=kind == "bn")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "pn":
            return self.pn(x)
        if self.kind == "none":
            return x
        c, bn = x.shape[1], self.bn
        stats = bn.running_mean is not None and not self.training
        return F.batch_norm(
            x,
            bn.running_mean[:c] if stats else None,
            bn.running_var[:c] if stats else None,
            bn.weight[:c],
            bn.bias[:c],
            training=not stats,
            momentum=0.1,
            eps=bn.eps,
        )


class DynamicConv(nn.Module):
    """A convolution whose output channels, input channels and kernel are cropped at run time.

    A depthwise kernel starts as torch's default for a convolution (as the public code's):
    Kaiming-uniform over its fan-in k^d, a = sqrt(5). Kaiming-normal over its fan-out would count
    channels x k^d for a kernel that sees one channel, about sqrt(channels) too small (std 0.013
    at 256 channels, 7x7). A full kernel starts Kaiming-normal over its fan-out."""

    def __init__(self, dims: int, c_in: int, c_out: int, kernel: int, depthwise: bool = False):
        super().__init__()
        self.dims, self.depthwise = dims, depthwise
        self.weight = nn.Parameter(torch.empty(c_out, 1 if depthwise else c_in, *(kernel,) * dims))
        if depthwise:
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        else:
            nn.init.kaiming_normal_(self.weight, mode="fan_out")

    def forward(self, x: torch.Tensor, c_out: int, kernel: int, stride: int = 1) -> torch.Tensor:
        c_in = x.shape[1]
        shape = (c_in if self.depthwise else c_out, 1 if self.depthwise else c_in, *(kernel,) * self.dims)
        w = self.weight[crop(shape, self.weight.shape)]
        conv = F.conv2d if self.dims == 2 else F.conv1d
        return conv(x, w, None, stride, kernel // 2, 1, c_in if self.depthwise else 1)


class SlicedLinear(nn.Linear):
    """A linear layer over the first in-features its input has."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(z, self.weight[:, : z.shape[1]], self.bias)


class Block(nn.Module):
    """Depthwise-separable residual block (MobileNetV1, expand ratio 1)."""

    def __init__(self, dims: int, c_in: int, c_out: int, kernel: int, stride: int, norm: str, shortcut_conv: bool):
        super().__init__()
        self.stride = stride
        self.dw = DynamicConv(dims, c_in, c_in, kernel, depthwise=True)
        self.n1 = DynamicNorm(norm, c_in)
        self.pw = DynamicConv(dims, c_in, c_out, 1)
        self.n2 = DynamicNorm(norm, c_out)
        if norm == "pn":
            nn.init.zeros_(self.n2.pn.weight)
        elif norm != "none":
            nn.init.zeros_(self.n2.bn.weight)
        self.shortcut = DynamicConv(dims, c_in, c_out, 1) if shortcut_conv else None

    def forward(self, x: torch.Tensor, c_out: int, kernel: int) -> torch.Tensor:
        h = torch.relu(self.n1(self.dw(x, x.shape[1], kernel, self.stride)))
        h = self.n2(self.pw(h, c_out, 1))
        s = x
        if self.stride > 1:
            s = (F.avg_pool2d if x.dim() == 4 else F.avg_pool1d)(s, self.stride, self.stride, ceil_mode=True)
        if s.shape[1] != c_out:
            s = self.shortcut(s, c_out, 1)
        return h + s


class Stem(nn.Module):
    """3-tap conv -> norm -> ReLU."""

    def __init__(self, config: SupernetConfig, input_shape: tuple[int, ...]):
        super().__init__()
        self.stride = config.stem_stride
        self.conv = DynamicConv(len(input_shape) - 1, input_shape[0], config.stem, 3)
        self.norm = DynamicNorm(config.norm, config.stem)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x, self.conv.weight.shape[0], 3, self.stride)))


class Supernet(nn.Module):
    def __init__(self, config: SupernetConfig, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        self.config = config
        dims = len(input_shape) - 1
        self.stem = Stem(config, input_shape)
        stages, c_in, prev = [], config.stem, {config.stem}
        for widths, depths, kernels, stride in zip(config.widths, config.depths, config.kernels, config.strides):
            c_out = max(widths)
            blocks = [
                Block(
                    dims,
                    c_in if i == 0 else c_out,
                    c_out,
                    max(kernels),
                    stride if i == 0 else 1,
                    config.norm,
                    i == 0 and len(prev | set(widths)) > 1,
                )
                for i in range(max(depths))
            ]
            stages.append(nn.ModuleList(blocks))
            c_in, prev = c_out, set(widths)
        self.stages = nn.ModuleList(stages)
        self.dropout = nn.Dropout(config.dropout)
        self.linear = SlicedLinear(c_in, num_classes)
        nn.init.zeros_(self.linear.bias)
        self.active = largest(config)

    def set_active(self, subnet: Subnet) -> None:
        self.active = subnet

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.active
        z = self.stem(x)
        for stage, width, depth, kernel in zip(self.stages, a.widths, a.depths, a.kernels):
            for block in stage[:depth]:
                z = block(z, width, kernel)
        return self.linear(self.dropout(z.flatten(2).mean(2)))


def _build(config: SupernetConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    from .layers import require_input

    if len(input_shape) not in (2, 3):
        require_input(config.name, input_shape, 3, "image (C, H, W) or sequence (C, L)")
    return Supernet(config, input_shape, num_classes)


register(
    "supernet", SupernetConfig, "FedSup supernet: MobileNetV1 stages with elastic width, depth and kernel (Table 5), PN"
)(_build)
register(
    "supernet_small",
    SupernetSmallConfig,
    "FedSup supernet for small inputs (digits, MNIST-1D): stride-1 stem, quarter widths",
)(_build)

"""Building blocks shared by the model families: Scaler and normalization choice."""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import ClassVar, Iterator, Literal

import torch
from pydantic import Field
from torch import nn

from ..config import ConfigError, ModelConfig

Norm = Literal["bn", "sbn", "gn", "in", "ln", "none"]


class WidthConfig(ModelConfig):
    """A model family whose hidden sizes scale with a width rate (HeteroFL Sec. 3.1)."""

    rate: float = Field(1.0, gt=0, le=1, description="width rate r: every hidden size becomes ceil(r * size)")


class ScaledConfig(WidthConfig):
    """A width-scalable family with a normalization choice and HeteroFL's Scaler."""

    norm: Norm = "bn"
    scaler: float = Field(1.0, gt=0, le=1, description="Scaler rate: the width relative to the global model")


def require_input(family: str, input_shape: tuple[int, ...], dims: int, what: str) -> None:
    """A one-line `ConfigError` when the dataset's samples do not have the family's shape."""
    if len(input_shape) != dims:
        raise ConfigError(f"model.name: {family} needs {what} input, the dataset gives {input_shape}")


class Scaler(nn.Module):
    """HeteroFL's Scaler (Diao et al. 2021, Sec. 3.2): s(x) = x / r in training, identity in eval.

    `rate` is the sub-model's width relative to the global model, so 1 for full-width models.
    """

    def __init__(self, rate: float = 1.0):
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.rate if self.training and self.rate != 1.0 else x

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


ROWS: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("rows", default=None)
"""Inside vectorized training, which rows of a client's padded batch are its samples."""


@contextlib.contextmanager
def real_rows(rows: torch.Tensor) -> Iterator[None]:
    """Batch norm in the block takes its statistics over the rows `rows` marks (> 0) only: what a
    vectorized client's padded batch really holds (`rayfl.algorithms.vectorize`)."""
    token = ROWS.set(rows)
    try:
        yield
    finally:
        ROWS.reset(token)


class RowBatchNorm:
    """Batch norm (a mixin before torch's class) whose training statistics, inside `real_rows`,
    are those of the marked rows alone: per channel the mean and biased variance over the real
    rows (and space) normalize every row, and the running statistics take the mean and the
    unbiased variance, as `torch.nn.functional.batch_norm` does over a batch of those rows only.
    Elsewhere it is torch's batch norm, with the same state."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = ROWS.get()
        if rows is None or not self.training:
            return super().forward(x)
        shape = (-1,) + (1,) * (x.dim() - 1)
        m = (rows > 0).to(x.dtype).reshape(shape)
        dims = [0, *range(2, x.dim())]
        n = (m.sum() * (x[0, 0].numel())).clamp(min=1)
        mean = (x * m).sum(dims) / n
        centred = x - mean.reshape(1, -1, *(1,) * (x.dim() - 2))
        var = (centred * centred * m).sum(dims) / n
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / self.num_batches_tracked if self.momentum is None else self.momentum
            with torch.no_grad():
                self.running_mean.copy_((1 - factor) * self.running_mean + factor * mean)
                self.running_var.copy_((1 - factor) * self.running_var + factor * var * n / (n - 1).clamp(min=1))
        channel = (1, -1, *(1,) * (x.dim() - 2))
        out = centred / torch.sqrt(var.reshape(channel) + self.eps)
        if self.affine:
            out = out * self.weight.reshape(channel) + self.bias.reshape(channel)
        return out


class BatchNorm1d(RowBatchNorm, nn.BatchNorm1d):
    pass


class BatchNorm2d(RowBatchNorm, nn.BatchNorm2d):
    pass


def make_norm(kind: Norm, channels: int, dims: int) -> nn.Module:
    """A normalization layer over `channels` features of a `dims`-D (0, 1 or 2 spatial) signal.

    bn: batch norm with running statistics; sbn: HeteroFL's static BN (batch statistics only,
    no running buffers, `track_running_stats=False`), both `RowBatchNorm` (vectorizable); gn:
    GroupNorm with 4 groups (HeteroFL's choice, fewer when channels are not divisible); in:
    instance norm (one group per channel); ln: layer norm over channels and space (GroupNorm with
    one group); none: identity.
    """
    if kind in ("bn", "sbn"):
        cls = BatchNorm2d if dims == 2 else BatchNorm1d
        if kind == "sbn":
            return cls(channels, momentum=None, track_running_stats=False)
        return cls(channels)
    if kind == "gn":
        return nn.GroupNorm(math.gcd(4, channels), channels)
    if kind == "in":
        return nn.GroupNorm(channels, channels)
    if kind == "ln":
        return nn.GroupNorm(1, channels)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {kind!r}")


def scaled(width: int, rate: float) -> int:
    """The hidden width of a sub-model: ceil(rate * width), at least 1 (HeteroFL Sec. 3.1)."""
    return max(1, math.ceil(rate * width))


WEIGHT_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Linear)


class SplitConfig(ModelConfig):
    """A family that can be cut into a bottom (worker) and a top (server) model for split learning."""

    split_layer: int = Field(1, ge=1, description="cut after this many weight layers (bottom on the worker)")


def split_index(model: nn.Sequential, k: int) -> int:
    """The position in `model` where the bottom ends: after the k-th weight layer and the
    modules that follow it up to the next weight layer, minus trailing dropout/flatten."""
    weights = [i for i, m in enumerate(model) if isinstance(m, WEIGHT_LAYERS)]
    if not 1 <= k < len(weights):
        raise ConfigError(f"model.split_layer: {k} is outside 1..{len(weights) - 1} for this model")
    end = weights[k]
    while end > weights[k - 1] + 1 and isinstance(model[end - 1], (nn.Dropout, nn.Flatten)):
        end -= 1
    return end


def split(model: nn.Sequential, k: int) -> tuple[nn.Sequential, nn.Sequential]:
    """(bottom, top) of a model cut after its k-th weight layer (modules are shared)."""
    i = split_index(model, k)
    return model[:i], model[i:]


class DepthConfig(ModelConfig):
    """A family built as a stem, `depth` repeated layers of one shape, and a head, so a model of
    depth L is the first L layers of a deeper one (InclusiveFL, FeDepth). State-dict names say
    which part a tensor is: `<layer_prefix><i>.<name>` for layer i, `head.` for the head, the rest
    the stem; a layer's tensors match another layer's by `<name>`."""

    depth: int = Field(6, ge=1, description="number of repeated layers")
    layer_prefix: ClassVar[str] = "layers."


def layer_of(key: str, prefix: str) -> tuple[int, str] | None:
    """(layer index, name relative to the layer) of a state-dict key, or None outside the layers."""
    if not key.startswith(prefix):
        return None
    index, _, rest = key[len(prefix) :].partition(".")
    return (int(index), rest) if index.isdigit() else None


def is_head(key: str) -> bool:
    return key.startswith("head.")

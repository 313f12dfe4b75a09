"""What any sub-net of the supernet costs: forward and training FLOPs per sample and parameters,
summed over its parts, each part measured once (E-FedSup's tiers, Sec. 3.4; the virtual clock)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ...devices.cost import flops_on
from ...models.supernet import Block, Stem, Subnet, SupernetConfig


class SubnetCost(NamedTuple):
    forward_flops: float
    """Inference FLOPs per sample: what a tier's budget bounds (Sec. 3.4, Table 6)."""
    train_flops: float
    """Training FLOPs per sample: what the virtual clock charges."""
    params: int


class SubnetCosts:
    """Forward and training FLOPs per sample and parameters of any sub-net, as sums over its parts
    (the stem, each block at its input and output widths and kernel, the classifier), each part
    measured once (`flops_on`) on a module of exactly its size: FLOPs add up over layers, so a
    sub-net of thousands costs a few dictionary look-ups (rejection sampling draws many)."""

    def __init__(self, config: SupernetConfig, input_shape: tuple[int, ...], num_classes: int):
        self.config, self.input_shape, self.num_classes = config, tuple(input_shape), num_classes
        size = [math.ceil(n / config.stem_stride) for n in input_shape[1:]]
        self.spatial = []
        """Each stage's input size."""
        for stride in config.strides:
            self.spatial.append(tuple(size))
            size = [math.ceil(n / stride) for n in size]
        self._parts: dict[tuple, SubnetCost] = {}

    def part(self, key: tuple, build, shape: tuple[int, ...]) -> SubnetCost:
        """A part's cost; inside the network its input takes a gradient too (the stem's, the
        data, does not)."""
        if key not in self._parts:
            module = build()
            x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0)).requires_grad_(key[0] != "stem")
            self._parts[key] = SubnetCost(
                flops_on(module, x, train=False),
                flops_on(module, x, train=True),
                sum(p.numel() for p in module.parameters()),
            )
        return self._parts[key]

    def __call__(self, s: Subnet) -> SubnetCost:
        cfg, dims = self.config, len(self.input_shape) - 1
        parts = [self.part(("stem",), lambda: _Part(Stem(cfg, self.input_shape)), self.input_shape)]
        c_in = cfg.stem
        for i, (width, depth, kernel) in enumerate(zip(s.widths, s.depths, s.kernels)):
            for j in range(depth):
                stride = cfg.strides[i] if j == 0 else 1
                size = self.spatial[i] if j == 0 else tuple(math.ceil(n / cfg.strides[i]) for n in self.spatial[i])
                build = lambda c=c_in, st=stride: _Part(
                    Block(dims, c, width, kernel, st, cfg.norm, c != width), width, kernel
                )
                parts.append(self.part(("block", c_in, width, kernel, stride, size), build, (c_in, *size)))
                c_in = width
        parts.append(self.part(("head", c_in), lambda: torch.nn.Linear(c_in, self.num_classes), (c_in,)))
        return SubnetCost(*(sum(column) for column in zip(*parts)))


class _Part(torch.nn.Module):
    """A supernet part called with its active sizes (what `flops_on` measures)."""

    def __init__(self, part: torch.nn.Module, *sizes: int):
        super().__init__()
        self.part, self.sizes = part, sizes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part(x, *self.sizes)

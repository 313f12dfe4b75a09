"""Built modules per model variant, reused across tasks; weights are loaded per use."""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np
import torch
from torch import nn

from ..config import ModelConfig
from ..types import Weights
from .registry import build_model


def to_torch(weights: Weights) -> dict[str, torch.Tensor]:
    """numpy state -> torch state (copies, so read-only object-store arrays are fine)."""
    return {k: torch.tensor(np.asarray(v)) for k, v in weights.items()}


def to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    """A module's state -> numpy state (copies on the host, as it crosses the object store)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


class ModelCache:
    """One module per (variant, input shape, classes); weights are loaded per use."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, device: str = "cpu"):
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.device = device
        self._models: dict[Hashable, nn.Module] = {}

    def build(self, variant: ModelConfig) -> nn.Module:
        """A new module of the variant on this cache's device (not cached)."""
        return build_model(variant, self.input_shape, self.num_classes).to(self.device)

    def load(self, variant: ModelConfig, weights: Weights, strict: bool = True) -> nn.Module:
        if variant not in self._models:
            self._models[variant] = self.build(variant)
        model = self._models[variant]
        model.load_state_dict(to_torch(weights), strict=strict)
        return model

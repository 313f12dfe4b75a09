"""Built modules per model variant (and slot), reused across tasks; weights are copied in per use."""

from __future__ import annotations

import warnings
from typing import Any, Hashable, Mapping, Sequence

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


def on_device(weights: Mapping[str, Any], device: str | torch.device) -> dict[str, torch.Tensor]:
    """Name-keyed arrays (numpy, or tensors) as tensors on `device`: on the CPU numpy arrays are
    wrapped without a copy (they are only read: the source of `copy_`), elsewhere one copy each."""
    with warnings.catch_warnings():  # torch warns that read-only arrays (the object store's) stay read-only
        warnings.simplefilter("ignore")
        return {k: torch.as_tensor(v).to(device) for k, v in weights.items()}


class ModelCache:
    """One module per (variant, slot) on this cache's device, built once (outside any seeded
    draw: building never consumes a client's random numbers); weights are copied in per use."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, device: str = "cpu"):
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.device = device
        self._models: dict[Hashable, nn.Module] = {}
        self._tensors: dict[int, dict[str, torch.Tensor]] = {}

    def build(self, variant: ModelConfig) -> nn.Module:
        """A new module of the variant on this cache's device (not cached)."""
        return build_model(variant, self.input_shape, self.num_classes).to(self.device)

    def module(self, variant: ModelConfig, slot: str = "model") -> nn.Module:
        """The cached module of (variant, slot), built on first use."""
        key = (variant, slot)
        if key not in self._models:
            with torch.random.fork_rng(devices=[]):
                self._models[key] = self.build(variant)
        return self._models[key]

    def tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """A module's state by name, its own parameters and buffers (detached views), found once."""
        if id(model) not in self._tensors:
            self._tensors[id(model)] = {k: v.detach() for k, v in model.state_dict(keep_vars=True).items()}
        return self._tensors[id(model)]

    def load(
        self,
        variant: ModelConfig,
        weights: Mapping[str, Any],
        strict: bool = True,
        slot: str = "model",
        checked: set | None = None,
    ) -> nn.Module:
        """The cached module of (variant, slot) with `weights` copied into its tensors (`copy_`, no
        `load_state_dict`); `strict`: every tensor of the module, and no other, must be given.
        `checked`: the (module, weights) pairs whose names and shapes were checked already (a
        call's tensors on the device, loaded into the same module for client after client)."""
        model = self.module(variant, slot)
        own = self.tensors(model)
        names = [k for k in own if k in weights]
        key = (id(model), id(weights))
        if checked is None or key not in checked:
            if strict and own.keys() != weights.keys():
                missing, extra = sorted(own.keys() - weights.keys()), sorted(weights.keys() - own.keys())
                raise KeyError(
                    f"weights do not fit model {variant.name}: missing {missing[:3]}, unexpected {extra[:3]}"
                )
            weights = on_device({k: weights[k] for k in names}, self.device)
            for k in names:
                if tuple(weights[k].shape) != tuple(own[k].shape):
                    raise ValueError(f"{k}: shape {tuple(weights[k].shape)} does not fit {tuple(own[k].shape)}")
            if checked is not None:
                checked.add(key)
        with torch.no_grad():
            torch._foreach_copy_([own[k] for k in names], [weights[k] for k in names])
        return model

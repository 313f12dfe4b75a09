"""Model families with width rate as a first-class argument (see `registry`)."""

from . import (  # noqa: F401  (registration)
    cnn,
    cnn1d,
    cnn2,
    cnn_pfl,
    hf_encoder,
    mlp,
    preresnet,
    preresnet20,
    resstack,
    split_nets,
    supernet,
    transformer,
)
from .cache import ModelCache, to_numpy, to_torch
from .registry import build_model, config_class, families

__all__ = ["ModelCache", "build_model", "config_class", "families", "to_numpy", "to_torch"]

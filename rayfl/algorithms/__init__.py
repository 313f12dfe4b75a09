"""Algorithms: one module each, server policy + client procedure, registered by name."""

from . import (
    depthfl,
    ditto,
    fedavg,
    fedepth,
    fedopt,
    fedprox,
    fedsup,
    heterofl,
    inclusivefl,
    lgfedavg,
    localonly,
    perfedavg,
    pyramidfl,
    registry,
    sfl,
    splitmix,
)  # noqa: F401  (registration)
from .mergesfl import policy as _mergesfl  # noqa: F401  (registration)

__all__ = ["registry"]

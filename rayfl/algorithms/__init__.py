"""Algorithms: one module each, server policy + client procedure, registered by name."""

from . import depthfl, fedavg, fedepth, fedopt, fedprox, heterofl, inclusivefl, pyramidfl, registry, sfl, splitmix  # noqa: F401  (registration)
from .mergesfl import policy as _mergesfl  # noqa: F401  (registration)

__all__ = ["registry"]

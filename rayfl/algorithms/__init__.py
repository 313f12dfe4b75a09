"""Algorithms: one module each, server policy + client procedure, registered by name."""

from rayfl.algorithms import fedavg, fedopt, fedprox, heterofl, pyramidfl, registry, sfl  # noqa: F401  (registration)
from rayfl.algorithms.mergesfl import policy as _mergesfl  # noqa: F401  (registration)

__all__ = ["registry"]

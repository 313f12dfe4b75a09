"""Algorithms: one module each, server policy + client procedure, registered by name."""

from rayfl.algorithms import fedavg, fedopt, fedprox, heterofl, registry, sfl  # noqa: F401  (registration)

__all__ = ["registry"]

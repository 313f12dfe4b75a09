"""Algorithms by name: each registers its config class, server policy and client procedure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .. import catalog
from ..config import AlgorithmConfig, ConfigError
from .base import ClientProcedure, ServerPolicy

SYNC_ONLY = "its aggregation waits for every selected client, and rayfl has no rule for its stale or missing updates"


@dataclass(frozen=True)
class Algorithm:
    name: str
    config_class: type[AlgorithmConfig]
    policy: type[ServerPolicy]
    procedure: type[ClientProcedure]
    default_models: Mapping[str, str] = field(default_factory=dict)
    """Dataset name -> the model family this algorithm takes when the config names none."""
    default_profile: str | None = None
    """The built-in device profile this algorithm takes when the config names none (nor a trace):
    one whose budgets exercise its heterogeneity (FeDepth's memory scenario), as `default_models`."""
    vectorizable: bool = False
    """Opt-in: the procedure trains `ray.vectorize` clients of one variant in one batched call
    (`run_vectorized`, `vectorize.train_vectorized` over the procedure's own loss)."""
    sync_only: str | None = SYNC_ONLY
    """Why the algorithm runs in synchronous rounds only (`federation.mode: sync`), or None when
    it runs in every mode: its policy aggregates updates rebased onto the current model
    (`rayfl.algorithms.staleness`), each a leading block of the global tensors."""

    @property
    def summary(self) -> str:
        return catalog.ALGORITHMS[self.name]


_ALGORITHMS: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    catalog.summary(catalog.ALGORITHMS, "algorithm", algorithm.name)
    if algorithm.name in _ALGORITHMS:
        raise ValueError(f"algorithm {algorithm.name!r} registered twice")
    if algorithm.vectorizable and not hasattr(algorithm.procedure, "run_vectorized"):
        raise ValueError(
            f"algorithm {algorithm.name!r}: vectorizable, but {algorithm.procedure.__name__} has no run_vectorized (FedAvgClient's)"
        )
    _ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def algorithms() -> dict[str, Algorithm]:
    return dict(_ALGORITHMS)


def get(name: str) -> Algorithm:
    if name not in _ALGORITHMS:
        raise KeyError(
            f"unknown algorithm {name!r}{catalog.closest(name, _ALGORITHMS)} (known: {', '.join(sorted(_ALGORITHMS))})"
        )
    return _ALGORITHMS[name]


def config_class(name: str) -> type[AlgorithmConfig]:
    return get(name).config_class


def check_mode(name: str, mode: str) -> None:
    """`ConfigError` naming `federation.mode` when the algorithm cannot run in `mode`."""
    reason = get(name).sync_only
    if mode != "sync" and reason:
        raise ConfigError(f"federation.mode: {name} runs in synchronous rounds only, not {mode}: {reason}")

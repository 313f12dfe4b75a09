"""Aggregation rules as pure functions over name-keyed numpy arrays (STYLE.md 5).

No ray, no modules, no messages: inputs are `dict[str, np.ndarray]` plus weights, outputs
are new dicts. A key or shape mismatch raises `AggregationError` naming the key. Sums run
in float64 in the order given (the engine passes client-id order), then cast back.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from rayfl.types import Weights


class AggregationError(ValueError):
    """Updates that cannot be combined: a missing key or a shape mismatch."""


def invalid_reason(update: Weights, expected: Weights) -> str | None:
    """Why `update` cannot stand in for `expected` (keys, shapes, non-finite values), or None."""
    if set(update) != set(expected):
        missing, extra = sorted(set(expected) - set(update)), sorted(set(update) - set(expected))
        return f"keys differ (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, ref in expected.items():
        arr = np.asarray(update[name])
        if arr.shape != np.shape(ref):
            return f"{name}: shape {arr.shape} != {np.shape(ref)}"
        if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
            return f"{name}: non-finite values"
    return None


def _cast(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    if np.issubdtype(like.dtype, np.integer):
        value = np.rint(value)
    return value.astype(like.dtype, copy=False)


def weighted_mean(updates: Sequence[Weights], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """FedAvg's sum_k (n_k / n) w_k for every key (McMahan et al. 2017, Alg. 1)."""
    if not updates:
        raise AggregationError("no updates to aggregate")
    if len(updates) != len(weights):
        raise AggregationError(f"{len(updates)} updates but {len(weights)} weights")
    w = np.asarray(weights, dtype=np.float64)
    if (w < 0).any() or w.sum() <= 0:
        raise AggregationError("weights must be non-negative with a positive sum")
    w = w / w.sum()
    first = updates[0]
    out: dict[str, np.ndarray] = {}
    for name, ref in first.items():
        acc = np.zeros(np.shape(ref), dtype=np.float64)
        for wk, upd in zip(w, updates):
            if name not in upd:
                raise AggregationError(f"{name}: missing from an update")
            arr = np.asarray(upd[name])
            if arr.shape != acc.shape:
                raise AggregationError(f"{name}: shape {arr.shape} != {acc.shape}")
            acc += wk * arr
        out[name] = _cast(acc, np.asarray(ref))
    return out


def difference(new: Weights, old: Weights, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """new - old for each name (all of `old`'s keys by default), in float64."""
    keys = list(old) if names is None else list(names)
    return {k: np.asarray(new[k], dtype=np.float64) - np.asarray(old[k], dtype=np.float64) for k in keys}


def merge(base: Mapping[str, np.ndarray], updates: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`base` with the entries of `updates` replacing their namesakes, cast to `base`'s dtypes."""
    return {k: _cast(np.asarray(updates[k]), np.asarray(v)) if k in updates else v for k, v in base.items()}

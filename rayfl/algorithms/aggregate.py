"""Aggregation rules as pure functions over name-keyed numpy arrays (docs/design.md, Layers).

No ray, no modules, no messages: inputs are `dict[str, np.ndarray]` plus weights, outputs
are new dicts. A key or shape mismatch raises `AggregationError` naming the key. Sums run
in float64 in the order given (the engine passes client-id order), then cast back.
"""

from __future__ import annotations

from typing import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from ..types import Weights


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


WEIGHT = "#weight"
"""The key of a weighted sum's total weight (no state-dict name starts with '#')."""
COUNT = "#count"
"""Suffix of a count sum's per-entry counts."""


def add_up(parts: Iterable[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The elementwise sum of name-keyed arrays, in float64, in the order given (the engine
    passes client-id order within a group and group order across them, so every runner adds the
    same numbers the same way); empty for no parts. A key missing from a part adds nothing (a
    policy may key summands by group, InclusiveFL); a shape mismatch raises."""
    total: dict[str, np.ndarray] = {}
    for part in parts:
        total = accumulate(total, part)
    return total


def accumulate(total: dict[str, np.ndarray], part: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`total` + `part`, in place (a key new to `total` starts as a float64 copy): one step of
    `add_up`, for a caller that adds summands as they come instead of holding them."""
    for k, v in part.items():
        if k not in total:
            total[k] = np.array(v, np.float64)
        elif np.shape(v) != total[k].shape:
            raise AggregationError(f"{k}: shape {np.shape(v)} != {total[k].shape} in the summands")
        else:
            total[k] += v
    return total


def weighted_sum(update: Weights, weight: float) -> dict[str, np.ndarray]:
    """One client's share of FedAvg's sum: n_k w_k for every key, and n_k (under `WEIGHT`)."""
    if weight < 0:
        raise AggregationError("weights must be non-negative")
    return {**{k: weight * np.asarray(v, np.float64) for k, v in update.items()}, WEIGHT: np.array(float(weight))}


def mean_of(total: Mapping[str, np.ndarray], like: Weights) -> dict[str, np.ndarray]:
    """FedAvg's sum_k n_k w_k / sum_k n_k from a weighted sum, each key cast to `like`'s dtype."""
    if WEIGHT not in total or float(total[WEIGHT]) <= 0:
        raise AggregationError("weights must be non-negative with a positive sum (no updates, or all of weight 0)")
    missing = sorted(set(like) - set(total))
    if missing:
        raise AggregationError(f"{missing[0]}: missing from the updates")
    return {k: _cast(total[k] / total[WEIGHT], np.asarray(ref)) for k, ref in like.items()}


def weighted_mean(updates: Sequence[Weights], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """FedAvg's sum_k (n_k / n) w_k for every key (McMahan et al. 2017, Alg. 1)."""
    if len(updates) != len(weights):
        raise AggregationError(f"{len(updates)} updates but {len(weights)} weights")
    for upd in updates[1:]:
        for name, ref in updates[0].items():
            if name not in upd:
                raise AggregationError(f"{name}: missing from an update")
            if np.shape(upd[name]) != np.shape(ref):
                raise AggregationError(f"{name}: shape {np.shape(upd[name])} != {np.shape(ref)}")
    if not updates:
        raise AggregationError("no updates to aggregate")
    return mean_of(add_up(weighted_sum(u, w) for u, w in zip(updates, weights)), updates[0])


def difference(new: Weights, old: Weights, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """new - old for each name (all of `old`'s keys by default), in float64."""
    keys = list(old) if names is None else list(names)
    return {k: np.asarray(new[k], dtype=np.float64) - np.asarray(old[k], dtype=np.float64) for k in keys}


def merge(base: Mapping[str, np.ndarray], updates: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`base` with the entries of `updates` replacing their namesakes, cast to `base`'s dtypes."""
    return {k: _cast(np.asarray(updates[k]), np.asarray(v)) if k in updates else v for k, v in base.items()}


def prefix(shape: Sequence[int], full: Sequence[int] | None = None) -> tuple[slice, ...]:
    """The leading block of a tensor: HeteroFL's index set, the first n entries of every dimension
    (`full`, the global shape, is not needed: a `Where` for `count_sum`)."""
    return tuple(slice(0, n) for n in shape)


Where = Callable[[Sequence[int], Sequence[int]], tuple[slice, ...]]
"""Where a sub-model's tensor of a shape sits in the global tensor of another: `prefix`
(HeteroFL's leading block), or FedSup's centred kernels (`rayfl.models.supernet.crop`)."""


def extract(
    global_weights: Weights, shapes: Mapping[str, Sequence[int]], where: Where = prefix
) -> dict[str, np.ndarray]:
    """HeteroFL sub-model (Sec. 3.1): every tensor's leading block of the sub-model's shape (or
    the block `where` says: FedSup's sub-nets take centred kernels).

    Taking the first ceil(r C) channels of every layer keeps the layers aligned along the chain
    (a layer's input channels are the previous layer's first outputs; a PreResNet shortcut's are
    its block's input channels), so slicing by shape alone is the paper's extraction.
    """
    out = {}
    for name, shape in shapes.items():
        full = np.asarray(global_weights[name])
        if len(shape) != full.ndim or any(n > m for n, m in zip(shape, full.shape)):
            raise AggregationError(f"{name}: sub-model shape {tuple(shape)} does not fit {full.shape}")
        out[name] = full[where(shape, full.shape)].copy()
    return out


def count_sum(
    global_shapes: Mapping[str, Sequence[int]],
    update: Weights,
    row_mask: Mapping[str, np.ndarray] | None = None,
    weight: float = 1.0,
    where: Where = prefix,
) -> dict[str, np.ndarray]:
    """One client's share of HeteroFL's per-entry mean: its (weighted) entries placed in the
    global shapes (at `where`), and per entry the weight of its holding it (under `name + COUNT`).
    `row_mask` restricts named tensors (the classifier's rows and bias) to the rows marked True."""
    out: dict[str, np.ndarray] = {}
    mask = row_mask or {}
    for name, shape in global_shapes.items():
        shape = tuple(shape)
        acc, cnt = np.zeros(shape, np.float64), np.zeros(shape, np.float64)
        if name in update:
            arr = np.asarray(update[name], np.float64)
            if arr.ndim != len(shape) or any(n > m for n, m in zip(arr.shape, shape)):
                raise AggregationError(f"{name}: shape {arr.shape} does not fit {shape}")
            block = where(arr.shape, shape)
            held = np.ones(arr.shape, bool)
            if name in mask:
                rows = np.asarray(mask[name], bool)
                held &= rows.reshape((-1,) + (1,) * (arr.ndim - 1))[: arr.shape[0]]
            acc[block] = np.where(held, weight * arr, 0.0)
            cnt[block] = weight * held
        out[name], out[name + COUNT] = acc, cnt
    return out


def count_finish(global_weights: Weights, total: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """theta_e = sum_m w_m theta_m,e / sum_m w_m over the holders of each entry e; entries no
    client holds (and tensors absent from the total) keep their global value."""
    out = {}
    for name, old in global_weights.items():
        if name not in total:
            out[name] = old
            continue
        old = np.asarray(old)
        acc, cnt = total[name], total[name + COUNT]
        mean = np.divide(acc, cnt, out=np.zeros_like(acc), where=cnt > 0)
        out[name] = _cast(np.where(cnt > 0, mean, old), old)
    return out


def rebase(
    current: Weights, start: Weights, update: Weights, scale: float, names: Collection[str]
) -> dict[str, np.ndarray]:
    """An update trained from `start`, moved onto the model the server holds now: for each of
    its tensors in `names` (the parameters), the `current` block of its shape (`prefix`: a
    HeteroFL sub-model's block) plus `scale` (update - start), in float64, cast to the update's
    dtype (FedBuff's staleness-scaled delta, Nguyen et al. 2022 Alg. 1, applied at the current
    model). Other tensors (batch-norm statistics: a running variance moved by a delta can turn
    negative) keep the update's own values."""
    out = dict(update)
    for name, new in update.items():
        if name not in names:
            continue
        new = np.asarray(new)
        block = np.asarray(current[name])[prefix(new.shape)]
        delta = new.astype(np.float64) - np.asarray(start[name], np.float64)
        out[name] = _cast(block.astype(np.float64) + scale * delta, new)
    return out


def mix(current: Weights, update: Weights, alpha: float) -> dict[str, np.ndarray]:
    """FedAsync's mixing (Xie et al. 2019, Alg. 1): (1 - alpha) x_{t-1} + alpha x_new for each of
    the update's tensors, x_{t-1} the `current` block of its shape, in float64, cast back."""
    out = {}
    for name, new in update.items():
        new = np.asarray(new)
        block = np.asarray(current[name])[prefix(new.shape)].astype(np.float64)
        out[name] = _cast((1.0 - alpha) * block + alpha * new.astype(np.float64), new)
    return out

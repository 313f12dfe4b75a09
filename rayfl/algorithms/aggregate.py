"""Aggregation rules as pure functions over name-keyed arrays (docs/design.md, Layers).

No ray, no modules, no messages: inputs are name-keyed arrays plus weights, outputs are new
dicts. A key or shape mismatch raises `AggregationError` naming the key.

A policy whose aggregate is a sum describes one client's share of it as a summand: `Part`s
(`weighted_sum`, `count_sum`) that say what to add and compute nothing. A `Sum` adds summands in
float64, in the order given (the engine passes client-id order), on one device: where a call's
clients train, so a client's weights never leave the device and only the call's sum does
(docs/design.md, "On a GPU"); then across calls on the host. The product of a client's float32
tensor and an integral weight is exact in float64, so the device adds the same numbers the host
did, bit for bit. The finishing rules (`mean_of`, `count_finish`) run on the host.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

import numpy as np
import torch

from ..types import Weights
from .messages import OnDevice


class AggregationError(ValueError):
    """Updates that cannot be combined: a missing key or a shape mismatch."""


def invalid_reason(update: Mapping[str, Any], expected: Weights) -> str | None:
    """Why `update` cannot stand in for `expected` (keys, shapes, non-finite values), or None. An
    update still on its device (`OnDevice`) says itself which of its tensors are not finite."""
    if set(update) != set(expected):
        missing, extra = sorted(set(expected) - set(update)), sorted(set(update) - set(expected))
        return f"keys differ (missing {missing[:3]}, unexpected {extra[:3]})"
    nonfinite = update.nonfinite if isinstance(update, OnDevice) else None
    for name, ref in expected.items():
        arr = update[name]
        if tuple(arr.shape) != np.shape(ref):
            return f"{name}: shape {tuple(arr.shape)} != {np.shape(ref)}"
        if nonfinite is None:
            arr = np.asarray(arr)
            bad = np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all()
        else:
            bad = name in nonfinite
        if bad:
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


def prefix(shape: Sequence[int], full: Sequence[int] | None = None) -> tuple[slice, ...]:
    """The leading block of a tensor: HeteroFL's index set, the first n entries of every dimension
    (`full`, the global shape, is not needed: a `Where` for `count_sum`)."""
    return tuple(slice(0, n) for n in shape)


Where = Callable[[Sequence[int], Sequence[int]], tuple[slice, ...]]
"""Where a sub-model's tensor of a shape sits in the global tensor of another: `prefix`
(HeteroFL's leading block), or FedSup's centred kernels (`rayfl.models.supernet.crop`)."""


@dataclass(frozen=True)
class Part:
    """One tensor's share of a sum, described, not computed: `weight` x `value` (a numpy array or a
    tensor on any device). With `shape`, a count part (HeteroFL Sec. 3.1): `value` placed at
    `where` in zeros of the global `shape`, and `weight` added for each entry it holds under the
    name + `COUNT`; `rows` limits what it holds to the rows marked True (the classifier rows of a
    client's label split). A count part without a value (the client lacks the tensor) adds zeros."""

    value: Any
    weight: float = 1.0
    shape: tuple[int, ...] | None = None
    where: Where = prefix
    rows: np.ndarray | None = None


Summand = Mapping[str, Any]
"""One client's share of a sum: name -> `Part`, or -> an array or a number (weight 1)."""


def weighted_sum(update: Mapping[str, Any], weight: float) -> dict[str, Part]:
    """One client's share of FedAvg's sum: n_k w_k for every key, and n_k (under `WEIGHT`)."""
    if weight < 0:
        raise AggregationError("weights must be non-negative")
    return {**{k: Part(v, weight) for k, v in update.items()}, WEIGHT: Part(1.0, weight)}


def count_sum(
    global_shapes: Mapping[str, Sequence[int]],
    update: Mapping[str, Any],
    row_mask: Mapping[str, np.ndarray] | None = None,
    weight: float = 1.0,
    where: Where = prefix,
) -> dict[str, Part]:
    """One client's share of HeteroFL's per-entry mean: its (weighted) entries placed in the
    global shapes (at `where`), and per entry the weight of its holding it (under `name + COUNT`).
    `row_mask` restricts named tensors (the classifier's rows and bias) to the rows marked True."""
    mask = row_mask or {}
    out = {}
    for name, shape in global_shapes.items():
        shape = tuple(shape)
        value = update.get(name)
        if value is not None and (len(value.shape) != len(shape) or any(n > m for n, m in zip(value.shape, shape))):
            raise AggregationError(f"{name}: shape {tuple(value.shape)} does not fit {shape}")
        out[name] = Part(value, weight, shape, where, mask.get(name))
    return out


NARROW = (torch.float32, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.bool)
"""Dtypes of at most 24 significant bits: times an integral weight below 2^29, exact in float64."""


class Sum:
    """A running float64 sum of summands on one device, in the order they are added: a call's
    accumulator where its clients train (`rayfl.engine.host.run_group`), and the server's over
    calls (`add_up`). `scratch` (float64 buffers by shape, allocated once) may be shared by the
    sums of one host: a client's float32 tensor is widened into it before it is added."""

    def __init__(self, device: str | torch.device = "cpu", scratch: dict | None = None):
        self.device = torch.device(device)
        self.totals: dict[str, torch.Tensor] = {}
        self.numbers: dict[str, float] = {}
        """Parts whose value is a Python number (a total weight): added on the host, in float64."""
        self.scratch = {} if scratch is None else scratch

    def add(self, summand: Summand) -> "Sum":
        """Add one summand (a key new to the sum starts from zeros; a key missing from the summand
        adds nothing); a shape that differs from the sum's raises `AggregationError`."""
        with torch.no_grad():
            for name, part in summand.items():
                part = part if isinstance(part, Part) else Part(part)
                if isinstance(part.value, (int, float)):
                    self.numbers[name] = self.numbers.get(name, 0.0) + part.weight * part.value
                elif part.shape is None:
                    self._plain(name, part)
                else:
                    self._count(name, part)
        return self

    def arrays(self) -> dict[str, np.ndarray]:
        """The sum on the host, one copy per tensor."""
        return {
            **{k: v.cpu().numpy() for k, v in self.totals.items()},
            **{k: np.array(v) for k, v in self.numbers.items()},
        }

    def _tensor(self, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value.detach().to(self.device)
        with warnings.catch_warnings():  # read-only arrays (the object store's) are only read here
            warnings.simplefilter("ignore")
            return torch.as_tensor(np.asarray(value)).to(self.device)

    def _wide(self, value: torch.Tensor) -> torch.Tensor:
        """`value` in float64: itself, or copied into this host's scratch buffer of its shape."""
        if value.dtype == torch.float64:
            return value
        key = (tuple(value.shape), self.device)
        if key not in self.scratch:
            self.scratch[key] = torch.empty(value.shape, dtype=torch.float64, device=self.device)
        return self.scratch[key].copy_(value)

    def _into(self, total: torch.Tensor, value: torch.Tensor, weight: float) -> None:
        """total += weight x value with the product rounded as numpy's `total += weight * value`: a
        fused add where the product is exact, else the product first."""
        if weight == 1.0 or (float(weight).is_integer() and abs(weight) < 2**29 and value.dtype in NARROW):
            total.add_(self._wide(value), alpha=weight)
        else:
            total.add_(self._wide(value) * weight)

    def _plain(self, name: str, part: Part) -> None:
        value = self._tensor(part.value)
        total = self.totals.get(name)
        if total is None:
            self.totals[name] = value.to(torch.float64, copy=True).mul_(part.weight)
        elif value.shape != total.shape:
            raise AggregationError(f"{name}: shape {tuple(value.shape)} != {tuple(total.shape)} in the summands")
        else:
            self._into(total, value, part.weight)

    def _count(self, name: str, part: Part) -> None:
        if name not in self.totals:
            for key in (name, name + COUNT):
                self.totals[key] = torch.zeros(part.shape, dtype=torch.float64, device=self.device)
        acc, cnt = self.totals[name], self.totals[name + COUNT]
        if tuple(acc.shape) != part.shape:
            raise AggregationError(f"{name}: shape {part.shape} != {tuple(acc.shape)} in the summands")
        if part.value is None:
            return
        value = self._tensor(part.value)
        block = part.where(tuple(value.shape), part.shape)
        if part.rows is None:
            self._into(acc[block], value, part.weight)
            cnt[block] += part.weight
            return
        held = torch.as_tensor(np.asarray(part.rows, bool)).to(self.device)
        held = held.reshape((-1,) + (1,) * (value.dim() - 1))[: value.shape[0]].expand(value.shape)
        acc[block] += torch.where(held, self._wide(value) * part.weight, 0.0)
        cnt[block] += held.to(torch.float64) * part.weight


def add_up(parts: Iterable[Summand]) -> dict[str, np.ndarray]:
    """The sum of summands (or of plain name-keyed arrays) in float64, in the order given (the
    engine passes client-id order within a group and group order across them, so every runner
    adds the same numbers the same way); empty for no parts. A key missing from a part adds
    nothing (a policy may key summands by group, InclusiveFL); a shape mismatch raises."""
    total = Sum()
    for part in parts:
        total.add(part)
    return total.arrays()


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

"""Partitioners: deal a pooled dataset's training samples to `num_clients` logical clients.

Each exact partitioner is a pure function of the labels, the partition config and a seeded
generator, and assigns every training sample to exactly one client (shards may leave out the
duplicate shards HeteroFL never assigns; see `shards`). `sampled` draws each client's samples
only when asked (`clients.Sampled`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .. import rng
from ..config import (
    ConfigError,
    DataConfig,
    DirichletPartition,
    FlwrPartition,
    IidPartition,
    NaturalPartition,
    NonIidLevelPartition,
    SampledPartition,
    ShardsPartition,
)
from .clients import Clients, Partitioned, Sampled
from .sources import Dataset, load_dataset

_MAX_DRAWS = 1000


def iid(labels: np.ndarray, num_clients: int, g: np.random.Generator) -> list[np.ndarray]:
    """A uniform random permutation cut into `num_clients` near-equal parts."""
    return [np.sort(part) for part in np.array_split(g.permutation(len(labels)), num_clients)]


def dirichlet_unbalanced(
    labels: np.ndarray, num_clients: int, alpha: float, min_size: int, g: np.random.Generator, num_classes: int
) -> list[np.ndarray]:
    """Each class c is split over clients by proportions p_c ~ Dir(alpha * 1_N).

    The draw is repeated until every client holds at least `min_size` samples.
    """
    if num_clients * min_size > len(labels):
        raise ConfigError(
            f"data.num_clients: {num_clients} clients x data.partition.min_size {min_size} exceeds the {len(labels)} "
            f"training samples: set data.num_clients to at most {len(labels) // max(min_size, 1)}, or lower min_size"
        )
    by_class = [np.flatnonzero(labels == c) for c in range(num_classes)]
    for _ in range(_MAX_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            idx = g.permutation(idx)
            p = g.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(o) for o in out) >= min_size:
            return out
    raise ConfigError(
        f"data.partition.min_size: no Dirichlet({alpha}) draw in {_MAX_DRAWS} gave every client {min_size} samples; "
        "use fewer clients (data.num_clients), a lower min_size or a higher alpha"
    )


def dirichlet_balanced(
    labels: np.ndarray, num_clients: int, alpha: float, g: np.random.Generator, num_classes: int
) -> list[np.ndarray]:
    """Client k gets n/N samples with label mix v_k ~ Dir(alpha * q), q the global label prior.

    This is the form of Hsu et al. (2019) and MergeSFL (v ~ Dir(delta q)). When a class runs
    out, the client's remaining draws are renormalised over the classes still available.
    """
    counts_left = np.bincount(labels, minlength=num_classes)
    q = counts_left / counts_left.sum()
    pools = [list(g.permutation(np.flatnonzero(labels == c))) for c in range(num_classes)]
    sizes = [len(p) for p in np.array_split(np.arange(len(labels)), num_clients)]
    out = []
    for size in sizes:
        v = g.dirichlet(np.maximum(alpha * q, 1e-12))
        take = np.zeros(num_classes, dtype=int)
        need = size
        while need > 0:
            avail = counts_left - take
            p = np.where(avail > 0, v, 0.0)
            p = p / p.sum() if p.sum() > 0 else (avail > 0) / (avail > 0).sum()
            draw = np.minimum(g.multinomial(need, p), avail)
            take += draw
            need -= int(draw.sum())
        idx = []
        for c in np.flatnonzero(take):
            idx += pools[c][: take[c]]
            del pools[c][: take[c]]
        counts_left -= take
        out.append(np.sort(np.asarray(idx, dtype=np.int64)))
    return out


def shards(
    labels: np.ndarray,
    test_labels: np.ndarray,
    num_clients: int,
    k: int,
    g: np.random.Generator,
    num_classes: int,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """HeteroFL's non-iid-k split (public code `data.py`; docs/papers.md, HeteroFL: public code,
    non-iid-k split).

    Each class's indices, in dataset order, are cut into k*N/C contiguous shards. The list of
    classes repeated k*N/C times is permuted and reshaped to N x k; each row, de-duplicated,
    is a client's label split, so a client holds *at most* k classes. A client pops one random
    shard per owned class; the test set is split the same way with the same label splits.
    """
    if (k * num_clients) % num_classes:
        raise ConfigError(
            f"data.partition.classes_per_client: {k} x {num_clients} clients must be a multiple of "
            f"the {num_classes} classes"
        )
    per_class = k * num_clients // num_classes
    label_split = g.permutation(np.repeat(np.arange(num_classes), per_class)).reshape(num_clients, k)
    label_split = [np.unique(row) for row in label_split]

    def deal(y: np.ndarray) -> list[np.ndarray]:
        pools = [list(np.array_split(np.flatnonzero(y == c), per_class)) for c in range(num_classes)]
        out = []
        for classes in label_split:
            mine = [pools[c].pop(int(g.integers(len(pools[c])))) for c in classes]
            out.append(np.sort(np.concatenate(mine)))
        return out

    return deal(labels), deal(test_labels)


def partition(dataset: Dataset, config: DataConfig, seed: int) -> Clients:
    """Deal a pooled dataset's training samples to `num_clients` clients as `config.partition`
    says, seeded by (seed, "partition"): an exact split, or lazily drawn samples (`sampled`)."""
    spec, n = config.partition, config.num_clients
    g = rng.generator(seed, "partition")
    columns, dataset = dataset.columns, dataclasses.replace(dataset, columns=None)  # clients carry arrays only
    y, c = dataset.y_train, dataset.num_classes
    test = None
    if isinstance(spec, SampledPartition):
        return Sampled(dataset, spec, n, seed)
    if isinstance(spec, IidPartition) or (isinstance(spec, NonIidLevelPartition) and spec.p == 0):
        train = iid(y, n, g)
    elif isinstance(spec, NonIidLevelPartition):
        train = dirichlet_balanced(y, n, 1.0 / spec.p, g, c)
    elif isinstance(spec, DirichletPartition) and spec.balanced:
        train = dirichlet_balanced(y, n, spec.alpha, g, c)
    elif isinstance(spec, DirichletPartition):
        train = dirichlet_unbalanced(y, n, spec.alpha, spec.min_size, g, c)
    elif isinstance(spec, ShardsPartition):
        train, test = shards(y, dataset.y_test, n, spec.classes_per_client, g, c)
    elif isinstance(spec, FlwrPartition):
        train = flwr(dataset.name, columns, spec, n)
    elif isinstance(spec, NaturalPartition) and spec.by is not None:
        train = by_column(dataset.name, columns, spec.by, n)
    else:  # natural: only a generated federation, or a dataset with a client column, has its own clients
        raise ConfigError(
            f"data.partition.kind: {dataset.name} has no natural clients; use iid, dirichlet, shards, noniid_level, "
            "sampled (or natural with by: COLUMN for a Hugging Face dataset)"
        )
    return Partitioned(dataset, train, test)


def by_column(name: str, columns: Any, column: str, num_clients: int) -> list[np.ndarray]:
    """The natural split by a client column of the training split's `columns`: client k holds
    the samples of the column's k-th value in sorted order; the first `num_clients` values when
    there are more."""
    if columns is None or column not in columns.column_names:
        have = ", ".join(columns.column_names) if columns is not None else "none"
        raise ConfigError(f"data.partition.by: no column {column!r} in {name} (columns: {have})")
    values = np.asarray(columns[column])
    keys, owner = np.unique(values, return_inverse=True)
    if num_clients > len(keys):
        raise ConfigError(
            f"data.num_clients: {num_clients} clients, but column {column!r} has {len(keys)} distinct values: set "
            f"data.num_clients to at most {len(keys)}"
        )
    order = np.argsort(owner, kind="stable")
    bounds = np.cumsum(np.bincount(owner, minlength=len(keys)))[:-1]
    return np.split(order, bounds)[:num_clients]


def flwr(name: str, columns: Any, spec: FlwrPartition, num_clients: int) -> list[np.ndarray]:
    """Client k's samples as the Flower Datasets partitioner assigns them: the partitioner reads
    the training split (an index column added to it) and `load_partition(k)` returns its rows."""
    try:
        import flwr_datasets.partitioner as partitioners
    except ImportError:
        raise ConfigError("data.partition.kind: flwr needs Flower Datasets: pip install flwr-datasets") from None
    cls = getattr(partitioners, spec.partitioner, None)
    if cls is None:
        raise ConfigError(f"data.partition.partitioner: flwr_datasets.partitioner has no {spec.partitioner!r}")
    if columns is None:
        raise ConfigError(f"data.partition.kind: flwr partitions a Hugging Face dataset (data.name: hf), not {name}")
    try:
        partitioner = cls(num_partitions=num_clients, **(spec.model_extra or {}))
        partitioner.dataset = columns.add_column("__rayfl_index__", np.arange(len(columns)))
        return [
            np.sort(np.asarray(partitioner.load_partition(k)["__rayfl_index__"], np.int64)) for k in range(num_clients)
        ]
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"data.partition: {spec.partitioner}: {str(exc).splitlines()[0]}") from None


def load_clients(config: DataConfig, seed: int) -> Clients:
    """The configured data as logical clients: a generated federation's own (`natural`), or a
    pooled dataset partitioned. Unknown names, missing files and impossible partitions raise
    `ConfigError`."""
    data = load_dataset(config, seed)
    if isinstance(data, Clients):
        if not isinstance(config.partition, NaturalPartition):
            raise ConfigError(f"data.partition.kind: {config.name} generates each client's own data; use natural")
        return data
    return partition(data, config, seed)

"""A federation's logical clients: who holds which samples, produced when a client is asked for.

`Clients` is what the rest of rayfl sees of the data: how many samples each client holds
(`sizes`, one vectorized array), a client's training arrays (`train`, built on demand where
its task runs), its label counts (`label_histogram`, computed on first use: one vectorized pass
for a held partition; for lazily drawn clients a policy that needs every client's mix pays a
draw of each), the central test set and, where the split defines
them, per-client test indices. Three kinds:

- `Partitioned`: a pooled dataset split exactly (every sample to one client: iid, dirichlet,
  shards, noniid_level); the index arrays are held.
- `Sampled`: a pooled dataset whose clients draw their samples lazily, each from its own
  generator keyed by (seed, client): an IID share or a Dirichlet label mix. Clients are drawn
  independently, so they may share samples (sampling with replacement across clients), which a
  population larger than the pool needs anyway; a logical client costs nothing until drawn.
- `SyntheticClients`: FedProx's Synthetic(alpha, beta), each client generated from its own key;
  the central test set is the held-out 20% of a seeded sample of `eval_clients` clients.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
from scipy.special import ndtri

from .. import rng
from ..config import DataConfig, SampledPartition, SyntheticConfig
from .sources import Dataset, source


class Clients:
    """The logical clients of a federation (subclasses say where their samples come from)."""

    num_clients: int
    num_classes: int
    input_shape: tuple[int, ...]
    test_split: tuple[np.ndarray, ...] | None = None
    """Per-client indices into the central test set, where the split defines them (shards)."""

    def test_set(self, eval_clients: int) -> tuple[np.ndarray, np.ndarray]:
        """The central test set; where test data is per client, that of at most `eval_clients`."""
        raise NotImplementedError

    def sizes(self) -> np.ndarray:
        """(num_clients,) training samples per client."""
        raise NotImplementedError

    def train(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        """One client's training inputs (float32) and labels (int64)."""
        raise NotImplementedError

    def labels(self, client: int) -> np.ndarray:
        return self.train(client)[1]

    @functools.cached_property
    def _histogram(self) -> np.ndarray:
        return np.stack([np.bincount(self.labels(k), minlength=self.num_classes) for k in range(self.num_clients)])

    def label_histogram(self) -> np.ndarray:
        """(num_clients, num_classes) label counts: what a server policy may know of each client
        (computed once, on first use)."""
        return self._histogram


class Pooled(Clients):
    """Clients whose samples are rows of one pooled dataset."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self.num_classes = dataset.num_classes
        self.input_shape = dataset.input_shape

    def test_set(self, eval_clients: int) -> tuple[np.ndarray, np.ndarray]:
        return self.dataset.x_test, self.dataset.y_test

    def indices(self, client: int) -> np.ndarray:
        raise NotImplementedError

    def train(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        idx = self.indices(client)
        return self.dataset.x_train[idx], self.dataset.y_train[idx]

    def labels(self, client: int) -> np.ndarray:
        return self.dataset.y_train[self.indices(client)]


class Partitioned(Pooled):
    """An exact partition: each client's index array, held."""

    def __init__(self, dataset: Dataset, parts: Sequence[np.ndarray], test_split: Sequence[np.ndarray] | None = None):
        super().__init__(dataset)
        self.parts = tuple(parts)
        self.num_clients = len(self.parts)
        self.test_split = None if test_split is None else tuple(test_split)

    def sizes(self) -> np.ndarray:
        return np.array([len(p) for p in self.parts])

    def indices(self, client: int) -> np.ndarray:
        return self.parts[client]

    @functools.cached_property
    def _histogram(self) -> np.ndarray:
        """One vectorized pass over the held index arrays (no per-client loop)."""
        owner = np.repeat(np.arange(self.num_clients), [len(p) for p in self.parts])
        labels = self.dataset.y_train[np.concatenate(self.parts)] if self.parts else np.zeros(0, np.int64)
        return np.bincount(owner * self.num_classes + labels, minlength=self.num_clients * self.num_classes).reshape(
            self.num_clients, self.num_classes
        )


class Sampled(Pooled):
    """Clients that draw `size` samples each from the pool when asked, keyed by (seed, client):
    uniformly (`mix: iid`) or with a label mix v ~ Dir(alpha q), q the pool's label prior
    (`mix: dirichlet`); without replacement within a client, independently across clients."""

    def __init__(self, dataset: Dataset, spec: SampledPartition, num_clients: int, seed: int):
        super().__init__(dataset)
        self.spec, self.num_clients, self.seed = spec, num_clients, seed
        self.size = min(spec.size, len(dataset.y_train))
        self.by_class = [np.flatnonzero(dataset.y_train == c) for c in range(dataset.num_classes)]
        self.prior = np.array([len(p) for p in self.by_class], float) / len(dataset.y_train)

    def sizes(self) -> np.ndarray | rng.Column:
        size = self.size
        if self.num_clients <= rng.EAGER_CLIENTS:
            return np.full(self.num_clients, size)
        return rng.Column(self.num_clients, lambda ids: np.full(len(ids), size))

    def indices(self, client: int) -> np.ndarray:
        g = rng.generator(self.seed, "sampled-partition", client=client)
        if self.spec.mix == "iid":
            return np.sort(g.choice(len(self.dataset.y_train), self.size, replace=False))
        counts = g.multinomial(self.size, g.dirichlet(np.maximum(self.spec.alpha * self.prior, 1e-12)))
        picks = [g.choice(pool, n, replace=n > len(pool)) for pool, n in zip(self.by_class, counts) if n]
        return np.sort(np.concatenate(picks))


class SyntheticClients(Clients):
    """Synthetic(alpha, beta) of Li et al., "Federated Optimization in Heterogeneous Networks", Sec. 5.1.

    Client k, from its own generator (seed, client k): u_k ~ N(0, alpha), B_k ~ N(0, beta),
    v_k ~ N(B_k, 1)^d; x ~ N(v_k, Sigma) with Sigma_jj = j^-1.2; W_k ~ N(u_k, 1)^(c x d),
    b_k ~ N(u_k, 1)^c; y = argmax softmax(W_k x + b_k). Sizes follow FedProx's code,
    lognormal(4, 2) + 50 (capped at 20x `mean_samples`), drawn for all clients at once (above
    `rng.EAGER_CLIENTS`, keyed per client: exp(4 + 2 Phi^-1(u_k)), u_k `rng.keyed_uniform`); the
    last 20% of a client's samples are its test data. The central test set gathers the test data
    of every client, or of a seeded sample of `eval_clients` of them in a larger population.
    """

    def __init__(self, spec: SyntheticConfig, num_clients: int, seed: int):
        self.spec, self.num_clients, self.seed = spec, num_clients, seed
        self.num_classes, self.input_shape = spec.num_classes, (spec.dim,)
        cap = 20 * spec.mean_samples
        if num_clients <= rng.EAGER_CLIENTS:
            self.total: np.ndarray | rng.Column = np.minimum(
                rng.generator(seed, "synthetic-sizes").lognormal(4, 2, num_clients).astype(np.int64) + 50, cap
            )
        else:
            self.total = rng.Column(
                num_clients,
                lambda ids: np.minimum(
                    np.exp(4 + 2 * ndtri(rng.keyed_uniform(seed, "synthetic-sizes", ids))).astype(np.int64) + 50, cap
                ),
            )
        self.sigma = np.arange(1, spec.dim + 1, dtype=np.float64) ** -1.2

    def test_set(self, eval_clients: int) -> tuple[np.ndarray, np.ndarray]:
        """The held-out samples of every client, or of a seeded sample of `eval_clients` clients."""
        n = self.num_clients
        shown = (
            range(n)
            if n <= eval_clients
            else np.sort(rng.generator(self.seed, "eval-clients").choice(n, eval_clients, replace=False))
        )
        parts = [(self.samples(int(k)), self.train_size(int(k))) for k in shown]
        return np.concatenate([x[t:] for (x, _), t in parts]), np.concatenate([y[t:] for (_, y), t in parts])

    def train_size(self, client: int) -> int:
        return int(self.total[client] - self.total[client] // 5)

    def sizes(self) -> np.ndarray | rng.Column:
        total = self.total
        if isinstance(total, np.ndarray):
            return total - total // 5
        return rng.Column(self.num_clients, lambda ids: total[ids] - total[ids] // 5)

    def samples(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        """All of client k's samples (train then test), from its own generator."""
        spec, d, c = self.spec, self.spec.dim, self.spec.num_classes
        g = rng.generator(self.seed, "synthetic", client=client)
        u_k, b_k = g.normal(0, np.sqrt(spec.alpha)), g.normal(0, np.sqrt(spec.beta))
        v_k = g.normal(b_k, 1, d)
        w, b = g.normal(u_k, 1, (c, d)), g.normal(u_k, 1, c)
        x = v_k + g.normal(0, 1, (int(self.total[client]), d)) * np.sqrt(self.sigma)
        return x.astype(np.float32), np.argmax(x @ w.T + b, axis=1).astype(np.int64)

    def train(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.samples(client)
        n = self.train_size(client)
        return x[:n], y[:n]


@source(
    "synthetic",
    "FedProx's Synthetic(alpha, beta): one logistic model per client, 60-d inputs, each client generated on demand",
    partition="natural",
)
def load_synthetic(config: DataConfig, seed: int) -> SyntheticClients:
    return SyntheticClients(config.synthetic, config.num_clients, seed)

"""Randomness keyed by what it is for, never by where it runs.

Every random draw in rayfl comes from a generator spawned from
(seed, round, client, purpose) through `numpy.random.SeedSequence`, so a draw does
not depend on which process, actor or thread makes it, nor on the order of tasks.
"""

from __future__ import annotations

import contextlib
import random
import zlib
from typing import Callable, Iterator

import numpy as np
import torch

_NO_CLIENT = -1


def _purpose_key(purpose: str) -> int:
    """A stable 32-bit integer for a purpose string (crc32, identical on every host)."""
    return zlib.crc32(purpose.encode())


def key(seed: int, purpose: str, round: int = 0, client: int = _NO_CLIENT) -> np.random.SeedSequence:
    """The seed sequence of one (seed, round, client, purpose) draw."""
    return np.random.SeedSequence([seed, round, client + 1, _purpose_key(purpose)])


def generator(seed: int, purpose: str, round: int = 0, client: int = _NO_CLIENT) -> np.random.Generator:
    """A numpy generator for one (seed, round, client, purpose) draw."""
    return np.random.default_rng(key(seed, purpose, round, client))


def torch_seed(seed: int, purpose: str, round: int = 0, client: int = _NO_CLIENT) -> int:
    """A 63-bit torch seed for one (seed, round, client, purpose) draw."""
    return int(key(seed, purpose, round, client).generate_state(1, np.uint64)[0] >> np.uint64(1))


@contextlib.contextmanager
def seeded_torch(seed: int, purpose: str, round: int = 0, client: int = _NO_CLIENT) -> Iterator[None]:
    """Context manager: torch's CPU generator seeded for one draw, restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(torch_seed(seed, purpose, round, client))
        yield


@contextlib.contextmanager
def seeded_device(
    device: torch.device, seed: int, purpose: str, round: int = 0, client: int = _NO_CLIENT
) -> Iterator[None]:
    """Context manager: the generators a client's training draws from on `device` (the CPU's, and
    a CUDA device's own) seeded for one draw and restored afterwards. Only these: `torch.manual_seed`
    seeds every backend and, for each one not initialised, formats a stack trace (about a
    millisecond a client)."""
    generators = [torch.default_generator]
    if device.type == "cuda":
        generators.append(torch.cuda.default_generators[device.index or torch.cuda.current_device()])
    states = [g.get_state() for g in generators]
    s = torch_seed(seed, purpose, round, client)
    for g in generators:
        g.manual_seed(s)
    try:
        yield
    finally:
        for g, state in zip(generators, states):
            g.set_state(state)


# ----------------------------------------------------------------------------- keyed per-client draws
# For populations too large to hold an array of N entries: each client's value is a pure function
# of (seed, purpose, client), computed for the clients asked about only.

EAGER_CLIENTS = 10_000_000
"""Up to this many clients, per-client draws made for the whole population at once stay arrays
(a numpy permutation of device classes, FedProx's lognormal sizes of `synthetic`: what every
figure in docs/ was measured with); above it they are keyed draws (`KeyedPermutation`,
`keyed_uniform`, held as `Column`s), so memory does not grow with N."""

_MASK64 = np.uint64(2**64 - 1)


def global_states(cuda: bool = False) -> tuple:
    """The global RNGs' states (Python's, numpy's, torch's, and with `cuda` CUDA's): what a fresh
    process starts with, so a pooled actor can be set back to it between runs."""
    return (
        random.getstate(),
        np.random.get_state(),
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if cuda else None,
    )


def restore_global_states(states: tuple) -> None:
    """Set the global RNGs back to `states` (`global_states`)."""
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])
    if states[3] is not None:
        torch.cuda.set_rng_state_all(states[3])


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (Steele, Lea and Flood 2014), elementwise on uint64 (wrapping)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _key64(seed: int, purpose: str, part: int = 0) -> np.uint64:
    return np.uint64(key(seed, purpose, part).generate_state(1, np.uint64)[0])


def keyed_uniform(seed: int, purpose: str, clients: np.ndarray) -> np.ndarray:
    """One uniform draw in (0, 1) per client, a function of (seed, purpose, client) only."""
    bits = _mix64(np.asarray(clients, np.uint64) ^ _key64(seed, purpose)) >> np.uint64(12)
    return (bits.astype(np.float64) + 0.5) * 2.0**-52  # 52 bits: (2^52 - 0.5) 2^-52 < 1 exactly


class KeyedPermutation:
    """A pseudo-random permutation of 0..n-1 keyed by (seed, purpose), evaluated at the points
    asked without an array of n entries: a balanced Feistel network (Luby and Rackoff 1988), six
    rounds of splitmix64 on the smallest even-bit domain holding n, with cycle walking (Black and
    Rogaway 2002) back into 0..n-1."""

    ROUNDS = 6

    def __init__(self, n: int, seed: int, purpose: str):
        self.n = n
        self.half = max(1, (max(1, n - 1).bit_length() + 1) // 2)
        self.keys = [_key64(seed, purpose, r) for r in range(self.ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        mask = np.uint64((1 << self.half) - 1)
        left, right = x >> np.uint64(self.half), x & mask
        for k in self.keys:
            left, right = right, left ^ (_mix64(right ^ k) & mask)
        return (left << np.uint64(self.half)) | right

    def __call__(self, points: np.ndarray) -> np.ndarray:
        y = self._encrypt(np.asarray(points, np.uint64))
        outside = y >= np.uint64(self.n)
        while outside.any():
            y[outside] = self._encrypt(y[outside])
            outside = y >= np.uint64(self.n)
        return y.astype(np.int64)


class Column:
    """Per-client values of a population of n, computed for the clients asked about and never held
    n-long: `column[k]` is one value, `column[ids]` an array; `np.asarray(column)` computes all n
    (for whole-population code, at its cost)."""

    def __init__(self, n: int, values: Callable[[np.ndarray], np.ndarray]):
        self.n, self.values = n, values

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, clients):
        if isinstance(clients, (int, np.integer)):
            return self.values(np.array([clients], np.int64))[0]
        ids = np.asarray(clients)
        return self.values(ids.ravel().astype(np.int64)).reshape(ids.shape)

    def __iter__(self) -> Iterator:
        return iter(np.asarray(self))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.values(np.arange(self.n, dtype=np.int64))
        return out if dtype is None else out.astype(dtype)

"""Randomness keyed by what it is for, never by where it runs.

Every random draw in rayfl comes from a generator spawned from
(seed, round, client, purpose) through `numpy.random.SeedSequence`, so a draw does
not depend on which process, actor or thread makes it, nor on the order of tasks.
"""

from __future__ import annotations

import contextlib
import zlib
from typing import Iterator

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
    """Context manager: torch's global RNG seeded for one draw, restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed(seed, purpose, round, client))
        yield

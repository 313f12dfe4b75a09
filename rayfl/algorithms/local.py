"""The local-loop kit every client procedure shares: a leaf of the algorithm kit.

A procedure's `run(task, data, ctx)` gets the client's samples (`ClientData`) and a
`ClientContext`: seeded batches keyed by (seed, round, client, purpose), the cached model
variants, and the non-finite check that ends a task as a failure (`docs/design.md`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from .. import rng
from ..config import ModelConfig
from ..models import ModelCache
from ..types import Weights
from .messages import ClientTask

NON_FINITE = "non-finite training loss"
"""The reason of a client whose training loss went NaN or infinite."""


class ClientDiverged(Exception):
    """Raised by `ClientContext.finite`: the task ends as a `ClientFailure` with this reason."""


def epoch_batches(num_examples: int, batch_size: int, g: np.random.Generator) -> list[np.ndarray]:
    """One epoch's shuffled batches; a trailing batch of a single sample is dropped (batch
    norm cannot train on it) unless it is the client's only sample."""
    order = g.permutation(num_examples)
    out = [order[i : i + batch_size] for i in range(0, num_examples, batch_size)]
    if len(out) > 1 and len(out[-1]) == 1:
        out.pop()
    return out


def epoch_samples(num_examples: int, batch_size: int) -> int:
    """The samples in one epoch of `epoch_batches`: all but a dropped trailing single sample."""
    dropped = num_examples > batch_size and (num_examples - 1) % batch_size == 0
    return num_examples - dropped


@dataclass(frozen=True)
class ClientData:
    """One client's training samples, on the device the task runs on."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]


@dataclass
class LocalState:
    """A client's state during local training (mutable, local to one task)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    extras: Any = None


class ClientContext:
    """What a client procedure's `run` shares with every other: written once, called by any loop."""

    def __init__(self, seed: int, models: ModelCache):
        self.seed = seed
        self.models = models
        self.samples_drawn = 0
        """Samples in the batches handed out for the current task (what a failure still cost)."""
        self.layouts: dict[tuple, dict[str, tuple[int, ...]]] = {}
        """Strides of vectorized clients' stacked parameters, by (variant, K, input shape): found
        once on this host (`rayfl.algorithms.vectorize.gradient_strides`)."""

    @property
    def device(self) -> str:
        return self.models.device

    def load(self, variant: ModelConfig, weights: Weights) -> nn.Module:
        """The variant's cached module, loaded with `weights` (numpy)."""
        return self.models.load(variant, weights)

    def build(self, variant: ModelConfig) -> nn.Module:
        """A module of its own (not cached): for procedures that hold several models at once."""
        return self.models.build(variant)

    def batches(
        self,
        task: ClientTask,
        num_examples: int,
        epochs: int | None = None,
        batch_size: int | None = None,
        purpose: str = "batches",
    ) -> Iterator[np.ndarray]:
        """Index batches of `epochs` (default the task's) shuffled epochs, drawn from the
        generator keyed by (seed, round, client, purpose); a second pass with its own purpose
        (a fine-tuning stage, say) draws independently of the first."""
        g = rng.generator(self.seed, purpose, task.round, task.client_id)
        for _ in range(task.local_epochs if epochs is None else epochs):
            for batch in epoch_batches(num_examples, batch_size or task.batch_size, g):
                self.samples_drawn += len(batch)
                yield batch

    @staticmethod
    def finite(loss: float) -> float:
        """`loss`, or the end of the task as a failure when it is NaN or infinite."""
        if not math.isfinite(loss):
            raise ClientDiverged(NON_FINITE)
        return loss

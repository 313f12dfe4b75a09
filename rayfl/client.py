"""The shared client executor loop: one place that turns a `ClientTask` into a `ClientResult`.

Both the in-process runner and the Ray client actors host a `ClientRunner`: it holds the
training arrays and the partition, caches one module per model variant, and drives an
algorithm's client procedure (init / step per batch / final) over seeded batches.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np
import torch
from torch import nn

from . import rng
from .algorithms import registry
from .algorithms.base import ClientFailure, ClientProcedure, ClientResult, ClientTask
from .config import RunConfig
from .devices.cost import nbytes
from .models import ModelCache, to_torch
from .models.layers import split
from .algorithms.split import SplitSession, SplitTask
from .types import Weights

TORCH_THREADS = 1
"""Client training and evaluation run with a fixed torch thread count, so results do not
depend on the host (in-process, one actor or many give bit-identical metrics)."""


def to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def batches(num_examples: int, batch_size: int, g: np.random.Generator) -> list[np.ndarray]:
    """One epoch's shuffled batches; a trailing batch of a single sample is dropped (batch
    norm cannot train on it) unless it is the client's only sample."""
    order = g.permutation(num_examples)
    out = [order[i : i + batch_size] for i in range(0, num_examples, batch_size)]
    if len(out) > 1 and len(out[-1]) == 1:
        out.pop()
    return out


class ClientRunner:
    """Runs client tasks of one federation against the training arrays it holds."""

    def __init__(
        self,
        config: RunConfig,
        x_train: np.ndarray,
        y_train: np.ndarray,
        train_indices: Sequence[np.ndarray],
        num_classes: int,
        device: str = "cpu",
    ):
        self.config = config
        self.x_train, self.y_train = x_train, y_train
        self.train_indices = train_indices
        self.procedure: ClientProcedure = registry.get(config.algorithm.name).procedure(config)
        self.models = ModelCache(x_train.shape[1:], num_classes, device)
        self.device = device

    def open_split(self, task: SplitTask) -> SplitSession:
        """A bottom-model session for a split-learning task (the model cut at its split layer).
        Each session owns its module: one executor may hold several workers' sessions at once."""
        idx = self.train_indices[task.client_id]
        bottom = split(self.models.build(task.model).to(self.device), task.model.split_layer)[0]
        bottom.load_state_dict(to_torch(task.weights))
        x = torch.from_numpy(self.x_train[idx]).to(self.device)
        y = torch.from_numpy(self.y_train[idx]).to(self.device)
        return SplitSession(task, bottom, x, y, self.config.seed, self.config.federation.momentum)

    def run(self, task: ClientTask) -> ClientResult | ClientFailure:
        """Local training for one task; a non-finite loss ends it early as a `ClientFailure`.

        With `task.pace` (clock: emulate) the call then sleeps until its wall time equals its
        scaled virtual time, so stragglers are real to Ray's scheduler.
        """
        start = time.perf_counter()
        idx = self.train_indices[task.client_id]
        x = torch.from_numpy(self.x_train[idx]).to(self.device)
        y = torch.from_numpy(self.y_train[idx]).to(self.device)
        model = self.models.load(task.model, task.weights)
        with rng.seeded_torch(self.config.seed, "client-train", task.round, task.client_id):
            state = self.procedure.init(task, model)
            g = rng.generator(self.config.seed, "batches", task.round, task.client_id)
            total, samples = 0.0, 0
            for _ in range(task.local_epochs):
                for b in batches(len(idx), task.batch_size, g):
                    loss = self.procedure.step(state, (x[b], y[b]))
                    if not math.isfinite(loss):
                        return ClientFailure(task.client_id, task.round, "non-finite training loss")
                    total += loss * len(b)
                    samples += len(b)
            result = self.procedure.final(task, state, len(idx), samples, total / max(samples, 1))
        if task.pace is not None:
            wall = task.pace.wall_seconds(samples, nbytes(task.weights), nbytes(result.weights))
            time.sleep(max(0.0, wall - (time.perf_counter() - start)))
        return result

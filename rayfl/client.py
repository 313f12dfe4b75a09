"""Where client tasks run: the `ClientRunner` both runners host, and the pieces every local loop shares.

The in-process executor and each Ray client actor hold a `ClientRunner`: the training arrays,
the partition and the algorithm's client procedure. For each task it hands the procedure the
client's data (`ClientData`) and a `ClientContext` (seeded batches, cached model variants,
the non-finite check), runs the procedure's `run` with torch's RNG keyed by (seed, round,
client), and turns a non-finite loss into a `ClientFailure`. Sessions of server-in-the-loop
rounds are opened here too.
"""

from __future__ import annotations

import ctypes
import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from . import rng
from .algorithms.base import ClientFailure, ClientProcedure, ClientResult, ClientTask
from .config import ModelConfig
from .data import Clients
from .models import ModelCache
from .types import ClientId, Weights

if TYPE_CHECKING:
    from .algorithms.exchange import ClientSession
    from .engine import Federation

TORCH_THREADS = 1
"""Client training and evaluation run with a fixed torch thread count, so results do not
depend on the host (in-process, one actor or many give bit-identical metrics)."""


def keep_freed_memory() -> None:
    """Have glibc's allocator keep freed memory for reuse (the mmap threshold raised to 32 MB, the
    most every glibc takes; the trim threshold to 256 MB) instead of handing it back to the
    kernel and faulting it in again. Process-wide and for good: the process's resident memory
    then stays near its peak. Vectorized clients on a CPU allocate megabytes of stacked
    gradients every step; with glibc's defaults a round of 10 MLP clients took about 1,500 page
    faults and a third longer (`bench/vectorize.py` prints the faults). Set when a runner is
    built to train vectorized on the CPU; Linux only (elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:  # not glibc
        return
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD


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


@dataclass(frozen=True)
class ClientData:
    """One client's training samples, on the device the task runs on."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]


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
        self, task: ClientTask, num_examples: int, epochs: int | None = None, batch_size: int | None = None, purpose: str = "batches"
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
            raise ClientDiverged("non-finite training loss")
        return loss


class ClientRunner:
    """Runs client tasks of one federation against the training arrays it holds."""

    def __init__(self, procedure: ClientProcedure, clients: Clients, seed: int, device: str = "cpu", vectorize: int = 1):
        self.procedure = procedure
        self.clients = clients
        self.seed = seed
        self.vectorize = vectorize
        if vectorize > 1 and device == "cpu":
            keep_freed_memory()
        self.context = ClientContext(seed, ModelCache(clients.input_shape, clients.num_classes, device))

    @classmethod
    def of(cls, fed: "Federation", device: str = "cpu") -> "ClientRunner":
        return cls(fed.procedure, fed.clients, fed.config.seed, device, fed.config.ray.vectorize)

    def data(self, client: int) -> ClientData:
        """The client's samples, produced now (a logical client costs nothing until its task runs)."""
        x, y = self.clients.train(client)
        device = self.context.device
        return ClientData(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))

    def run(self, task: ClientTask) -> ClientResult | ClientFailure:
        """The procedure's local round, its torch draws keyed by (seed, round, client).

        The one client-outcome logic of every runner: a client with no samples is skipped; a
        non-finite loss or any error in training ends the task as a `ClientFailure` naming it,
        with the samples it had processed (the in-process runner and every actor alike)."""
        data = self.data(task.client_id)
        if len(data) == 0:
            return ClientFailure(task.client_id, task.round, "no training samples", skipped=True)
        self.context.samples_drawn = 0
        with rng.seeded_torch(self.seed, "client-train", task.round, task.client_id):
            try:
                return self.procedure.run(task, data, self.context)
            except Exception as exc:  # a client's failure is data, never the run's end
                reason = str(exc) if isinstance(exc, ClientDiverged) else f"{type(exc).__name__}: {exc}"
                return ClientFailure(task.client_id, task.round, reason.splitlines()[0], self.context.samples_drawn)

    def run_all(self, tasks: Sequence[ClientTask]) -> list[ClientResult | ClientFailure]:
        """The tasks of a group: one after another, or `vectorize` at a time in one batched call
        (`ray.vectorize`; the procedure's `run_vectorized`) over tasks of one model variant (a
        group may mix variants, InclusiveFL's depths), in the order given."""
        if self.vectorize <= 1:
            return [self.run(t) for t in tasks]
        variants: dict[ModelConfig, list[ClientTask]] = {}
        for t in tasks:
            variants.setdefault(t.model, []).append(t)
        out: dict[ClientId, ClientResult | ClientFailure] = {}
        for same in variants.values():
            for i in range(0, len(same), self.vectorize):
                out.update((o.client_id, o) for o in self.run_vectorized(same[i : i + self.vectorize]))
        return [out[t.client_id] for t in tasks]

    def run_vectorized(self, tasks: Sequence[ClientTask]) -> list[ClientResult | ClientFailure]:
        """Clients with samples trained together; the same outcome logic as `run`."""
        datas = {t.client_id: self.data(t.client_id) for t in tasks}
        live = [t for t in tasks if len(datas[t.client_id])]
        try:
            trained = self.procedure.run_vectorized(live, [datas[t.client_id] for t in live], self.context) if live else []
        except Exception as exc:  # a client's failure is data, never the run's end
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            trained = [ClientFailure(t.client_id, t.round, reason) for t in live]
        by_client = {o.client_id: o for o in trained}
        return [by_client.get(t.client_id) or ClientFailure(t.client_id, t.round, "no training samples", skipped=True) for t in tasks]

    def open_session(self, task: ClientTask) -> "ClientSession":
        """The procedure's session for a server-in-the-loop round (each owns its modules, so one
        host may hold several clients' sessions at once)."""
        return self.procedure.open_session(task, self.data(task.client_id), self.context)

"""The contract between a server policy and a client procedure (STYLE.md 2-4, 7).

A server policy has verbs, not a loop: `select`, `configure`, `aggregate`, `evaluate`, each
taking the round and the frozen `ServerState` and returning new values. A client procedure owns
its local loop: `run(task, data, ctx)`, by default init / step per batch / final over the seeded
batches that `ctx` gives (`rayfl.client.ClientContext`). A policy may also drive a
server-in-the-loop round (`open_driver`, see `exchange`). Tasks and results are frozen, typed
messages; tasks are built by keyword (`ServerPolicy.task`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .. import rng
from . import aggregate as aggregate_lib
from ..config import ModelConfig, RunConfig
from ..devices.cost import ModelCost, nbytes
from ..devices.profile import DeviceState
from ..models import to_numpy
from ..optim import OptimizerSpec, lr_schedule
from ..types import ClientId, Round, Weights

if TYPE_CHECKING:
    from ..client import ClientContext, ClientData
    from ..evaluate import Evaluator
    from .exchange import ClientSession, RoundDriver


@dataclass(frozen=True, kw_only=True)
class ClientTask:
    """What the server sends one client for one round."""

    client_id: ClientId
    round: Round
    weights: Weights
    model: ModelConfig
    """The model variant the client trains (a width-sliced model has its own rate)."""
    local_epochs: int
    batch_size: int
    optimizer: OptimizerSpec
    """The local optimizer, with this round's (scheduled) learning rate."""


@dataclass(frozen=True)
class ClientResult:
    """What one client returns: its new weights and what it cost."""

    client_id: ClientId
    round: Round
    weights: Weights
    num_examples: int
    """Size of the client's local dataset (FedAvg's weight n_k)."""
    num_samples: int
    """Samples processed in training (epochs x examples, less skipped batches): the compute cost."""
    train_loss: float
    metrics: Mapping[str, float] = field(default_factory=dict)
    """The algorithm's per-client numbers: extra columns of `clients.parquet`."""
    keep: Mapping[str, Any] = field(default_factory=dict)
    """What the server keeps for this client until its next task (a persistent local model, such
    as FeDepth's MKD peer): never aggregated, never counted as sent (it stays on the device)."""


@dataclass(frozen=True)
class ClientFailure:
    """A task that produced no update; `reason` says why (diverged, an error, the actor died).

    `num_samples` are the samples it processed before it failed: the compute it still cost on
    the virtual clock, with the model's download. `skipped`: the client had nothing to train and
    declined the task at once (it costs nothing)."""

    client_id: ClientId
    round: Round
    reason: str
    num_samples: int = 0
    skipped: bool = False


@dataclass(frozen=True)
class ServerState:
    """Everything a policy needs between rounds; a checkpoint is this state serialized.

    `opt_state` and `clients` may be any nesting of dicts, lists, tuples and dataclasses of
    numpy arrays, numbers and strings (`rayfl.checkpoint` writes them without pickle)."""

    round: Round
    weights: Weights
    opt_state: Any = None
    clients: Mapping[ClientId, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> "ServerState":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class FederationContext:
    """The static facts of a federation that policies read (never mutate)."""

    seed: int
    num_clients: int
    num_classes: int
    input_shape: tuple[int, ...]
    num_examples: np.ndarray
    """Training samples per client."""
    label_histogram: Callable[[], np.ndarray]
    """(num_clients, num_classes) label counts per client, computed on the first call (a large
    lazily drawn population pays a pass over its clients; most policies never ask)."""
    param_names: frozenset[str]
    """State-dict names that are trainable parameters (the rest are buffers)."""
    memory_bytes: np.ndarray
    """Each client's device memory budget, bytes."""
    test_split: tuple[np.ndarray, ...] | None
    """Per-client test indices where the partition defines them (shards), else None."""
    cost_of: Callable[[ModelConfig], ModelCost]
    """Measured size, FLOPs and activations of a model variant (cached)."""
    device_state: Callable[[ClientId, Round], DeviceState] | None = None
    """What a client's device offers in a round (policies that measure devices read it)."""
    device_classes: np.ndarray | None = None
    """(num_clients,) each client's device class: its index in the profile's classes."""


class ServerPolicy:
    """Server half of an algorithm. Subclasses override verbs; instances hold only config and
    what is derived from it once (the round's learning rates, sub-model shapes, ...)."""

    sums: bool = False
    """Whether the round's aggregate is a sum over clients (FedAvg's weighted sum, HeteroFL's
    sums and counts): then each accepted client's `summand` is added up where the clients ran,
    a batch of clients returns one partial sum instead of one model each, and `aggregate` gets
    the total with weightless results. Otherwise `aggregate` gets every client's weights."""

    def __init__(self, config: RunConfig, context: FederationContext):
        self.config = config
        self.context = context
        self.lrs = lr_schedule(config.federation)

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        """Refuse, at config load, options this algorithm cannot honour (`ConfigError` naming the key)."""

    def global_model(self) -> ModelConfig:
        """The variant the server holds and evaluates (the configured model by default)."""
        return self.config.model

    def summary(self) -> dict[str, Any]:
        """Extra `summary.json` entries of this algorithm."""
        return {}

    def init_state(self, weights: Weights) -> ServerState:
        return ServerState(round=0, weights=dict(weights))

    def lr(self, round: Round) -> float:
        """The round's learning rate under `federation.lr_schedule` (the `lr` column)."""
        return self.lrs[round - 1]

    def optimizer(self, round: Round) -> OptimizerSpec:
        """The round's local optimizer: `federation`'s kind and settings at the scheduled rate."""
        return OptimizerSpec.of(self.config.federation, self.lr(round))

    def task(self, client: ClientId, round: Round, weights: Weights, *, kind: type[ClientTask] = ClientTask, **fields: Any) -> ClientTask:
        """One task, by keyword: the configured model, epochs, batch size and the round's optimizer
        unless `fields` say otherwise; `kind` is a task subclass with the algorithm's own fields."""
        fed = self.config.federation
        defaults = dict(model=self.config.model, local_epochs=fed.local_epochs, batch_size=fed.batch_size, optimizer=self.optimizer(round))
        return kind(client_id=client, round=round, weights=weights, **{**defaults, **fields})

    def select(self, state: ServerState, round: Round, available: Sequence[ClientId]) -> list[ClientId]:
        """Uniform sampling without replacement, a pure function of (seed, round, available). It
        draws positions in `available` (a range when everyone is online), never copying it."""
        g = rng.generator(self.context.seed, "select", round)
        k = min(self.config.federation.clients_per_round, len(available))
        return sorted(int(available[i]) for i in g.choice(len(available), size=k, replace=False))

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        return [self.task(c, round, state.weights) for c in clients]

    def open_driver(self, state: ServerState, round: Round, tasks: Sequence[ClientTask]) -> "RoundDriver | None":
        """A server-in-the-loop driver for the round (split learning's top model), or None when
        each client trains on its own (`ClientProcedure.run`)."""
        return None

    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """One accepted client's share of the round's sum (policies with `sums`), float64 arrays."""
        raise NotImplementedError

    def aggregate(self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray] | None = None) -> ServerState:
        """The new state from the round's accepted results, and, for policies with `sums`, the
        total of their summands (None: added up here from the results' weights)."""
        raise NotImplementedError

    def total(self, results: Sequence[ClientResult], total: Mapping[str, np.ndarray] | None) -> Mapping[str, np.ndarray] | None:
        """`total` as given, or the sum of the results' summands (results that still carry weights)."""
        return total if total is not None else aggregate_lib.add_up(self.summand(r) for r in results)

    def round_metrics(self, state: ServerState, round: Round, tasks: Sequence[ClientTask]) -> dict[str, float]:
        """Extra columns of the round's `metrics.parquet` row (a policy's own diagnostics)."""
        return {}

    def client_cost(self, task: ClientTask, result: ClientResult) -> tuple[float, int, int]:
        """(training FLOPs, bytes down, bytes up) of one client's round on the virtual clock
        (also what `clock: emulate` paces the client by)."""
        flops = self.context.cost_of(task.model).train_flops * result.num_samples
        return flops, nbytes(task.weights), nbytes(result.weights)

    def evaluate(self, state: ServerState, round: Round, evaluator: "Evaluator") -> dict[str, float]:
        """Test metrics of the global model: `test_accuracy`, `test_loss`."""
        out = evaluator(state.weights, self.global_model())
        return {"test_accuracy": out["accuracy"], "test_loss": out["loss"]}

    def personalize(self, state: ServerState, round: Round, evaluator: "Evaluator") -> dict[str, float]:
        """Initial and personalized accuracy over clients (`federation.personalize_epochs` > 0):
        the global model, and it with its head fine-tuned on each client (`rayfl.personalize`).
        Personalized methods override this with their own personal models."""
        return self.personal_scores(evaluator.models.load(self.global_model(), state.weights), round, evaluator)

    def personal_scores(self, model: nn.Module, round: Round, evaluator: "Evaluator") -> dict[str, float]:
        """`rayfl.personalize.personal_scores` of `model` under the run's settings."""
        from ..personalize import personal_scores

        fed = self.config.federation
        return personal_scores(
            model, evaluator.clients, evaluator.x_test, evaluator.y.numpy(), self.context.test_split,
            seed=self.context.seed, round=round, epochs=fed.personalize_epochs, lr=fed.personalize_lr or fed.lr, batch_size=fed.batch_size,
        )


@dataclass
class LocalState:
    """A client's state during local training (mutable, local to one task)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    extras: Any = None


class ClientProcedure:
    """Client half of an algorithm. `run` is the whole local round; its default drives
    `init`, then `step` per seeded batch, then `final`. Override `run` to train in stages, train
    several models per batch or add local passes; the context gives the shared pieces."""

    vectorizable: bool = False
    """Whether `run_vectorized` trains several clients at once (`ray.vectorize`)."""

    def __init__(self, config: RunConfig):
        self.config = config

    def run_vectorized(self, tasks: Sequence[ClientTask], datas: Sequence["ClientData"], ctx: "ClientContext") -> list["ClientResult | ClientFailure"]:
        """Several clients' local rounds in one batched computation (procedures that are `vectorizable`)."""
        raise NotImplementedError(f"{type(self).__name__} trains its clients one at a time")

    def run(self, task: ClientTask, data: "ClientData", ctx: "ClientContext") -> ClientResult:
        """Local training for one task. A non-finite loss (`ctx.finite`) ends it as a failure."""
        state = self.init(task, ctx.load(task.model, task.weights))
        total, samples = 0.0, 0
        for b in ctx.batches(task, len(data)):
            loss = ctx.finite(self.step(state, data.batch(b)))
            total += loss * len(b)
            samples += len(b)
        return self.final(task, state, len(data), samples, total / max(samples, 1))

    def open_session(self, task: ClientTask, data: "ClientData", ctx: "ClientContext") -> "ClientSession":
        """The client side of a server-in-the-loop round (algorithms whose policy opens a driver)."""
        raise NotImplementedError(f"{type(self).__name__} has no session: its policy opens no driver")

    def init(self, task: ClientTask, model: nn.Module) -> LocalState:
        raise NotImplementedError

    def step(self, state: LocalState, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """One optimisation step on one batch; returns the batch loss."""
        raise NotImplementedError

    def final(self, task: ClientTask, state: LocalState, num_examples: int, num_samples: int, loss: float) -> ClientResult:
        return ClientResult(task.client_id, task.round, to_numpy(state.model), num_examples, num_samples, loss)

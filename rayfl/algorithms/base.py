"""The two halves of an algorithm: a server policy and a client procedure (`docs/design.md`).

A server policy has verbs, not a loop: `select` (among the `eligible` clients), `configure`,
`aggregate`, `evaluate`, each taking the round and the frozen `ServerState` and returning new
values. A client procedure owns its local loop: `run(task, data, ctx)`, by default init / step
per batch / final over the seeded batches that `ctx` gives (`local.ClientContext`). A policy may
also drive a server-in-the-loop round (`open_driver`, see `exchange`). The messages they trade
are in `messages`, the local-loop kit in `local`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .. import rng
from ..config import ModelConfig, RunConfig
from ..devices import nbytes
from ..evaluate import Evaluator
from ..models import to_numpy
from ..optim import OptimizerSpec, lr_schedule
from ..types import ClientId, Round, Weights
from .exchange import ClientSession, RoundDriver
from .local import ClientContext, ClientData, LocalState
from .messages import ClientResult, ClientTask, FederationContext, ServerState
from .personal import personal_scores


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

    def collapsed(self) -> str | None:
        """Why the device heterogeneity this algorithm is built for has no effect on this
        federation (every client would train the same thing), or None. A run whose policy says so
        warns in one line: the method then runs as its baseline (m-FeDepth as FeDepth, ExclusiveFL
        as AllLarge) under a profile without the pressure its paper assumes."""
        return None

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

    def task(
        self, client: ClientId, round: Round, weights: Weights, *, kind: type[ClientTask] = ClientTask, **fields: Any
    ) -> ClientTask:
        """One task, by keyword: the configured model, epochs, batch size and the round's optimizer
        unless `fields` say otherwise; `kind` is a task subclass with the algorithm's own fields."""
        fed = self.config.federation
        defaults = dict(
            model=self.config.model,
            local_epochs=fed.local_epochs,
            batch_size=fed.batch_size,
            optimizer=self.optimizer(round),
        )
        return kind(client_id=client, round=round, weights=weights, **{**defaults, **fields})

    def eligible(self, round: Round) -> np.ndarray | None:
        """(num_clients,) whether each client may be selected in `round`, or None when every
        client may (a policy whose clients may fit no sub-model, or belong to no group, says
        which do; `select` keeps the available clients it allows)."""
        return None

    def candidates(self, round: Round, available: Sequence[ClientId]) -> Sequence[ClientId]:
        """The available clients that are `eligible` in `round`: what `select` draws from (a
        policy that selects its own way draws from these too). `available` itself, never
        copied, when every client is eligible."""
        mask = self.eligible(round)
        if mask is None or mask.all():
            return available
        available = np.asarray(available)
        return available[mask[available]]

    def select(self, state: ServerState, round: Round, available: Sequence[ClientId]) -> list[ClientId]:
        """Uniform sampling without replacement of `federation.selected_clients` (the round's
        size; over-selected under `mode: deadline`) among the `candidates`, a pure function of
        (seed, round, available). It draws positions (in a range when everyone is online and
        eligible), never copying them."""
        available = self.candidates(round, available)
        g = rng.generator(self.context.seed, "select", round)
        k = min(self.config.federation.selected_clients, len(available))
        return sorted(int(available[i]) for i in g.choice(len(available), size=k, replace=False))

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        return [self.task(c, round, state.weights) for c in clients]

    def open_driver(self, state: ServerState, round: Round, tasks: Sequence[ClientTask]) -> RoundDriver | None:
        """A server-in-the-loop driver for the round (split learning's top model), or None when
        each client trains on its own (`ClientProcedure.run`)."""
        return None

    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """One accepted client's share of the round's sum (policies with `sums`), float64 arrays."""
        raise NotImplementedError

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """The new state from the round's accepted results. For policies with `sums`, `total`
        is the sum of their summands (reduced where the clients ran) and the results carry no
        weights; otherwise `total` is empty and the results carry their weights."""
        raise NotImplementedError

    def round_metrics(self, state: ServerState, round: Round, tasks: Sequence[ClientTask]) -> dict[str, float]:
        """Extra columns of the round's `metrics.parquet` row (a policy's own diagnostics)."""
        return {}

    def client_cost(self, task: ClientTask, result: ClientResult) -> tuple[float, int, int]:
        """(training FLOPs, bytes down, bytes up) of one client's round on the virtual clock
        (also what `clock: emulate` paces the client by)."""
        flops = self.context.cost_of(task.model).train_flops * result.num_samples
        return flops, nbytes(task.weights), nbytes(result.weights)

    def evaluate(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """Test metrics of the global model: `test_accuracy`, `test_loss`."""
        out = evaluator(state.weights, self.global_model())
        return {"test_accuracy": out["accuracy"], "test_loss": out["loss"]}

    def personalize(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """Initial and personalized accuracy over clients (`federation.personalize_epochs` > 0):
        the global model, and it with its head fine-tuned on each client (`personal`).
        Personalized methods override this with their own personal models."""
        return self.personal_scores(evaluator.models.load(self.global_model(), state.weights), round, evaluator)

    def personal_scores(self, model: nn.Module, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """`personal.personal_scores` of `model` under the run's settings."""
        fed = self.config.federation
        return personal_scores(
            model,
            evaluator.clients,
            evaluator.x_test,
            evaluator.y.numpy(),
            self.context.test_split,
            seed=self.context.seed,
            round=round,
            epochs=fed.personalize_epochs,
            lr=fed.personalize_lr or fed.lr,
            batch_size=fed.batch_size,
        )


class ClientProcedure:
    """Client half of an algorithm. `run` is the whole local round; its default drives
    `init`, then `step` per seeded batch, then `final`. Override `run` to train in stages, train
    several models per batch or add local passes; the context gives the shared pieces."""

    def __init__(self, config: RunConfig):
        self.config = config

    def run(self, task: ClientTask, data: ClientData, ctx: ClientContext) -> ClientResult:
        """Local training for one task. A non-finite loss (`ctx.finite`) ends it as a failure."""
        state = self.init(task, ctx.load(task.model, task.weights))
        total, samples = 0.0, 0
        for b in ctx.batches(task, len(data)):
            loss = ctx.finite(self.step(state, data.batch(b)))
            total += loss * len(b)
            samples += len(b)
        return self.final(task, state, len(data), samples, total / max(samples, 1))

    def open_session(self, task: ClientTask, data: ClientData, ctx: ClientContext) -> ClientSession:
        """The client side of a server-in-the-loop round (algorithms whose policy opens a driver)."""
        raise NotImplementedError(f"{type(self).__name__} has no session: its policy opens no driver")

    def init(self, task: ClientTask, model: nn.Module) -> LocalState:
        raise NotImplementedError

    def step(self, state: LocalState, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """One optimisation step on one batch; returns the batch loss."""
        raise NotImplementedError

    def final(
        self, task: ClientTask, state: LocalState, num_examples: int, num_samples: int, loss: float
    ) -> ClientResult:
        return ClientResult.of(
            task, weights=to_numpy(state.model), num_examples=num_examples, num_samples=num_samples, train_loss=loss
        )

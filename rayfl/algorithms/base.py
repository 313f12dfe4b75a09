"""The two halves of an algorithm: a server policy and a client procedure (`docs/design.md`).

A server policy has verbs, not a loop. Its core (`CORE`) is six: `init_state`, `global_model`,
`select`, `configure`, `aggregate`, `evaluate`, each taking the round and the frozen
`ServerState` and returning new values; what else it may do is an opt-in capability the engine
checks by capability (`capabilities`: eligibility, config checks, reports, personalisation, a
server in the loop, sums and costs computed where the clients train). A client procedure
supplies its steps (init / schedule / step / final) to the one client loop of `local`, which
owns the device work. The messages they trade are in `messages`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .. import rng
from ..config import ModelConfig, RunConfig
from ..evaluate import Evaluator
from ..optim import OptimizerSpec, lr_schedule
from ..types import ClientId, Round, Weights
from .capabilities import Eligible
from .exchange import ClientSession
from .local import ClientContext, ClientData, LocalState, Trained, finish
from .messages import ClientFailure, ClientResult, ClientTask, FederationContext, ServerState
from .personal import personal_scores

CORE = ("init_state", "global_model", "select", "configure", "aggregate", "evaluate")
"""The verbs every policy has (the defaults: FedAvg's round, uniform selection, the global model
evaluated; `aggregate` has none)."""
HELPERS = ("lr", "optimizer", "task", "candidates")
"""What a policy's verbs call and never override: the round's rate and optimizer, a task by
keyword, the eligible clients among the available ones."""


class ServerPolicy:
    """Server half of an algorithm: the `CORE` verbs over a frozen `ServerState`, and the
    capabilities its subclass opts in to (`capabilities`). Instances hold only config and what is
    derived from it once (the round's learning rates, sub-model shapes, ...)."""

    def __init__(self, config: RunConfig, context: FederationContext):
        self.config = config
        self.context = context
        self.lrs = lr_schedule(config.federation)

    # ------------------------------------------------------------------ the core

    def init_state(self, weights: Weights) -> ServerState:
        """Round 0's state from the global model's initial weights."""
        return ServerState(round=0, weights=dict(weights))

    def global_model(self) -> ModelConfig:
        """The variant the server holds and evaluates (the configured model by default)."""
        return self.config.model

    def select(self, state: ServerState, round: Round, available: Sequence[ClientId], count: int) -> list[ClientId]:
        """Uniform sampling without replacement of `count` clients (the scheduler's number:
        `clients_per_round`, over-selected under `mode: deadline`) among the `candidates`, a pure
        function of (seed, round, available, count). It draws positions (in a range when everyone
        is online and eligible), never copying them."""
        available = self.candidates(round, available)
        g = rng.generator(self.context.seed, "select", round)
        k = min(count, len(available))
        return sorted(int(available[i]) for i in g.choice(len(available), size=k, replace=False))

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        """One task per selected client: the global weights, the configured model and training."""
        return [self.task(c, round, state.weights) for c in clients]

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """The new state from the round's accepted results. A policy that `Sums` gets `total`, the
        sum of their summands (reduced where the clients ran), and results without weights;
        otherwise `total` is empty and the results carry their weights. In every mode alike."""
        raise NotImplementedError

    def evaluate(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """Test metrics of the global model: `test_accuracy`, `test_loss`."""
        out = evaluator(state.weights, self.global_model())
        return {"test_accuracy": out["accuracy"], "test_loss": out["loss"]}

    # ------------------------------------------------------------------ helpers

    def lr(self, round: Round) -> float:
        """The round's learning rate under `federation.lr_schedule` (the `lr` column)."""
        return self.lrs[round - 1]

    def optimizer(self, round: Round) -> OptimizerSpec:
        """The round's local optimizer: `federation`'s kind and settings at the scheduled rate."""
        return OptimizerSpec.of(self.config.federation, self.lr(round))

    def task(
        self,
        client: ClientId,
        round: Round,
        weights: Weights,
        *,
        kind: type[ClientTask] = ClientTask,
        **fields: Any,
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

    def candidates(self, round: Round, available: Sequence[ClientId]) -> Sequence[ClientId]:
        """The available clients that are eligible in `round` (`capabilities.Eligible`): what
        `select` draws from (a policy that selects its own way draws from these too).
        `available` itself, never copied, when every client is eligible."""
        mask = self.eligible(round) if isinstance(self, Eligible) else None
        if mask is None or mask.all():
            return available
        available = np.asarray(available)
        return available[mask[available]]


def fine_tuned_head(policy: ServerPolicy, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
    """Initial and personalized accuracy over clients (`federation.personalize_epochs` > 0) for a
    policy that does not `Personalizes`: the global model, and it with its head fine-tuned on each
    client (`personal_scores`)."""
    return head_scores(policy, evaluator.models.load(policy.global_model(), state.weights), round, evaluator)


def head_scores(policy: ServerPolicy, model: nn.Module, round: Round, evaluator: Evaluator) -> dict[str, float]:
    """`personal.personal_scores` of `model` under the run's settings."""
    fed = policy.config.federation
    return personal_scores(
        model,
        evaluator.clients,
        evaluator.x_test,
        evaluator.y.numpy(),
        policy.context.test_split,
        seed=policy.context.seed,
        round=round,
        epochs=fed.personalize_epochs,
        lr=fed.personalize_lr or fed.lr,
        batch_size=fed.batch_size,
    )


class ClientProcedure:
    """Client half of an algorithm: its steps, trained through the one client loop
    (`local.train`, docs/design.md) that owns the device work. `init` loads its models (cached,
    `ClientContext.load`) and optimizers; `schedule` yields what each step trains on (by default
    the task's seeded batches; a procedure trains in stages, or on several streams at once, by
    yielding its own items, each with a `size`); `step` trains on one item and returns its
    loss, or named losses, as device tensors (every one is checked for NaN and infinity);
    `final` says what the client hands back (`local.Trained`)."""

    def __init__(self, config: RunConfig):
        self.config = config

    def run(self, task: ClientTask, data: ClientData, ctx: ClientContext) -> ClientResult | ClientFailure:
        """The one client loop: `init`, then `step` over the `schedule` (each step's losses kept on
        the device, with the item's `size` and the samples drawn so far), then `final`, then one
        read of everything (`local.finish`)."""
        state = self.init(task, ctx)
        steps: list[tuple[Mapping[str, torch.Tensor], int, int]] = []
        for item in self.schedule(task, state, data, ctx):
            with ctx.autocast():  # a step at a time: autocast's casts of the weights last as long as its context
                values = self.step(state, item)
            steps.append((values if isinstance(values, Mapping) else {"loss": values}, item.size, ctx.samples_drawn))
        return finish(task, data, self.final(task, state, ctx), steps, ctx.samples_drawn)

    def open_session(self, task: ClientTask, data: ClientData, ctx: ClientContext) -> ClientSession:
        """The client side of a server-in-the-loop round (algorithms whose policy opens a driver)."""
        raise NotImplementedError(f"{type(self).__name__} has no session: its policy opens no driver")

    def init(self, task: ClientTask, ctx: ClientContext) -> LocalState:
        raise NotImplementedError

    def schedule(self, task: ClientTask, state: LocalState, data: ClientData, ctx: ClientContext) -> Iterable[Any]:
        """What the steps train on: the task's epochs of seeded batches."""
        return ctx.batches(task, data)

    def step(self, state: LocalState, batch: Any) -> torch.Tensor | Mapping[str, torch.Tensor]:
        """One optimisation step on one batch; returns the batch loss (a device tensor)."""
        raise NotImplementedError

    def final(self, task: ClientTask, state: LocalState, ctx: ClientContext) -> Trained:
        """What the client hands back: by default its model's tensors."""
        return Trained(ctx.tensors(state.model))

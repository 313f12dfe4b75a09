"""The contract between a server policy and a client procedure (STYLE.md 2-4, 7).

A server policy has verbs, not a loop: `select`, `configure`, `aggregate`, `evaluate`, each
taking the round and the frozen `ServerState` and returning new values. A client procedure
is `init` / `step` / `final`; the shared loop in `rayfl.client` drives it. Tasks and results
are frozen, typed messages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .. import rng
from ..config import ModelConfig, RunConfig
from ..devices.cost import ModelCost, Pace, nbytes
from ..devices.profile import DeviceState
from ..types import ClientId, Round, Weights

if TYPE_CHECKING:
    from ..evaluate import Evaluator


@dataclass(frozen=True)
class ClientTask:
    """What the server sends one client for one round."""

    client_id: ClientId
    round: Round
    weights: Weights
    model: ModelConfig
    """The model variant the client trains (a width-sliced model has its own rate)."""
    local_epochs: int
    batch_size: int
    lr: float
    pace: Pace | None = None
    """Set by the engine under `clock: emulate`: the client then sleeps to its virtual time."""


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


@dataclass(frozen=True)
class ClientFailure:
    """A task that produced no usable result; `reason` says why (actor died, non-finite, shape)."""

    client_id: ClientId
    round: Round
    reason: str


@dataclass(frozen=True)
class ServerState:
    """Everything a policy needs between rounds; a checkpoint is this state serialized."""

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
    label_histogram: np.ndarray
    """(num_clients, num_classes) label counts per client."""
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



class ServerPolicy:
    """Server half of an algorithm. Subclasses override verbs; instances hold only config."""

    def __init__(self, config: RunConfig, context: FederationContext):
        self.config = config
        self.context = context

    def global_model(self) -> ModelConfig:
        """The variant the server holds and evaluates (the configured model by default)."""
        return self.config.model

    def summary(self) -> dict[str, Any]:
        """Extra `summary.json` entries of this algorithm."""
        return {}

    def init_state(self, weights: Weights) -> ServerState:
        return ServerState(round=0, weights=dict(weights))

    def select(self, state: ServerState, round: Round, available: Sequence[ClientId]) -> list[ClientId]:
        """Uniform sampling without replacement, a pure function of (seed, round, available)."""
        g = rng.generator(self.context.seed, "select", round)
        k = min(self.config.federation.clients_per_round, len(available))
        return sorted(int(c) for c in g.choice(np.asarray(available), size=k, replace=False))

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        fed = self.config.federation
        return [
            ClientTask(c, round, state.weights, self.config.model, fed.local_epochs, fed.batch_size, fed.lr)
            for c in clients
        ]

    def aggregate(self, state: ServerState, round: Round, results: Sequence[ClientResult]) -> ServerState:
        raise NotImplementedError

    def round_metrics(self, state: ServerState, round: Round, tasks: Sequence[ClientTask]) -> dict[str, float]:
        """Extra columns of the round's `metrics.parquet` row (a policy's own diagnostics)."""
        return {}

    def client_cost(self, task: ClientTask, result: ClientResult) -> tuple[float, int, int]:
        """(training FLOPs, bytes down, bytes up) of one client's round on the virtual clock."""
        flops = self.context.cost_of(task.model).train_flops * result.num_samples
        return flops, nbytes(task.weights), nbytes(result.weights)

    def evaluate(self, state: ServerState, round: Round, evaluator: "Evaluator") -> dict[str, float]:
        """Test metrics of the global model: `test_accuracy`, `test_loss`."""
        out = evaluator(state.weights, self.config.model)
        return {"test_accuracy": out["accuracy"], "test_loss": out["loss"]}


@dataclass
class LocalState:
    """A client's state during local training (mutable, local to one task)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    extras: Any = None


class ClientProcedure:
    """Client half of an algorithm: `init`, then `step` per batch, then `final`."""

    def __init__(self, config: RunConfig):
        self.config = config

    def init(self, task: ClientTask, model: nn.Module) -> LocalState:
        raise NotImplementedError

    def step(self, state: LocalState, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """One optimisation step on one batch; returns the batch loss."""
        raise NotImplementedError

    def final(self, task: ClientTask, state: LocalState, num_examples: int, num_samples: int, loss: float) -> ClientResult:
        weights = {k: v.detach().cpu().numpy().copy() for k, v in state.model.state_dict().items()}
        return ClientResult(task.client_id, task.round, weights, num_examples, num_samples, loss)

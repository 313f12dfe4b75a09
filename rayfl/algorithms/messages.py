"""The messages and state of the contract between a server policy and a client procedure.

A leaf of the algorithm kit (`docs/design.md`, "The contract"): tasks go from the server to
a client, results or failures come back, and the server's frozen `ServerState` passes from
round to round. `FederationContext` holds the static facts of a federation that policies read.
Tasks and results are frozen and built by keyword; a result is built from its task
(`ClientResult.of`), so its client and round are never copied by hand.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping

import numpy as np
import torch

from ..config import ConfigError, ModelConfig
from ..devices import DeviceProfile, DeviceState, ModelCost
from ..optim import OptimizerSpec
from ..statetypes import state_type
from ..types import ClientId, Round, Weights


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

    def columns(self) -> dict[str, Any]:
        """The task's own columns of its client's row in `clients.parquet` (subclasses add theirs)."""
        return {"batch_size": self.batch_size, "lr": self.optimizer.lr}


class OnDevice(dict):
    """A client's trained tensors where it trained (`torch.Tensor`s by state-dict name) and the
    names of those holding a NaN or an infinity (`nonfinite`: found on the device, read back with
    the client's losses). They are the module's own tensors: valid until the host trains its next
    client."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], nonfinite: Collection[str] = ()):
        super().__init__(tensors)
        self.nonfinite = frozenset(nonfinite)

    def host(self) -> dict[str, np.ndarray]:
        """The tensors as numpy arrays of their own (one copy each to the host)."""
        return {k: v.detach().to("cpu", copy=True).numpy() for k, v in self.items()}


@dataclass(frozen=True, kw_only=True)
class ClientResult:
    """What one client returns: its new weights and what it cost."""

    client_id: ClientId
    round: Round
    weights: Weights
    """Its new weights: numpy arrays, or where it trained, its tensors on the device (`OnDevice`)."""
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

    @classmethod
    def of(cls, task: ClientTask, **fields: Any) -> "ClientResult":
        """The result of `task`: its client and round, and the given fields."""
        return cls(client_id=task.client_id, round=task.round, **fields)

    def replace(self, **changes: Any) -> "ClientResult":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
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

    @classmethod
    def of(cls, task: ClientTask, reason: str, **fields: Any) -> "ClientFailure":
        """The failure of `task`, its reason's first line."""
        return cls(
            client_id=task.client_id, round=task.round, reason=reason.splitlines()[0] if reason else reason, **fields
        )


@state_type
@dataclass(frozen=True)
class ServerState:
    """Everything a policy needs between rounds; a checkpoint is this state serialized.

    `opt_state` and `clients` may be any nesting of dicts, lists, tuples and dataclasses of
    numpy arrays, numbers and strings (`rayfl.checkpoint` writes them without pickle; a
    policy's own dataclass is registered with `@rayfl.statetypes.state_type`)."""

    round: Round
    weights: Weights
    opt_state: Any = None
    clients: Mapping[ClientId, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> "ServerState":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class FederationContext:
    """The static facts of a federation that policies read (never mutate), resolved once when
    the federation is built (`rayfl.engine.build_federation`)."""

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
    profile: DeviceProfile | None = None
    """The run's device profile, its `devices.mix` applied (its classes, weakest first); None
    for a device trace."""
    training_memory: Callable[[ModelConfig], int] | None = None
    """Bytes a model variant needs to train under the run's batch size and optimizer
    (`ModelCost.training_memory`, measured once per variant)."""

    def classes(self, who: str) -> list:
        """The profile's device classes, for a policy that assigns work by class (`who` names
        the setting); `ConfigError` under a device trace, which has no classes."""
        if self.profile is None:
            raise ConfigError(
                f"devices.trace: {who} assigns work by device class; give devices.profile (a trace has no classes)"
            )
        return self.profile.classes

"""What a server policy may do beyond its core (`base.ServerPolicy`): opt-in capabilities.

Each capability is a protocol, and the engine asks a policy for one by capability
(`isinstance(policy, Personalizes)`), never by the algorithm's name. A policy has a
capability by defining its method:

| capability | method | what the engine does with it |
|---|---|---|
| `Eligible` | `eligible(round)` | selects (`select`, an async slot's draw) among the clients it allows |
| `ChecksConfig` | `check_config(config)` (a classmethod) | refuses, at config load, options it cannot honour |
| `Collapses` | `collapsed()` | warns, before the run, when the run's devices leave it nothing to adapt to |
| `ReportsRounds` | `round_metrics(state, round, tasks)` | adds the policy's columns to the round's row |
| `Summarizes` | `summary()` | adds the policy's entries to `summary.json` |
| `Personalizes` | `personalize(state, round, evaluator)` | its own initial and personal accuracy |
| `DrivesRounds` | `open_driver(state, round, tasks)` | a server in the loop: sessions relay its driver |
| `Sums` | `summand(result)` | its aggregate is a sum: added up where the clients train (`ClientAccount`) |
| `Costs` | `client_cost(task, result)` | what a client's round costs on the virtual clock (`ClientAccount`) |

The last two run where the clients train: they reach the engine through the federation's
`ClientAccount`, built once from the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import numpy as np

from ..config import RunConfig
from ..devices import nbytes
from ..evaluate import Evaluator
from ..types import Round
from .exchange import RoundDriver
from .messages import ClientResult, ClientTask, FederationContext, ServerState


@runtime_checkable
class Eligible(Protocol):
    def eligible(self, round: Round) -> np.ndarray | None:
        """(num_clients,) whether each client may be selected in `round`, or None when every client
        may (a policy whose clients may fit no sub-model, or belong to no group, says which do)."""


@runtime_checkable
class ChecksConfig(Protocol):
    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        """Refuse, at config load, options this algorithm cannot honour (`ConfigError` naming the
        key); a classmethod, called on the policy's class before any federation is built."""


@runtime_checkable
class Collapses(Protocol):
    def collapsed(self) -> str | None:
        """Why the device heterogeneity this algorithm is built for has no effect on this federation
        (every client would train the same thing), or None. A run whose policy says so warns in one
        line: the method then runs as its baseline (m-FeDepth as FeDepth, ExclusiveFL as AllLarge)
        under a profile without the pressure its paper assumes."""


@runtime_checkable
class ReportsRounds(Protocol):
    def round_metrics(self, state: ServerState, round: Round, tasks: Sequence[ClientTask]) -> dict[str, float]:
        """Extra columns of the round's `metrics.parquet` row (a policy's own diagnostics)."""


@runtime_checkable
class Summarizes(Protocol):
    def summary(self) -> dict[str, Any]:
        """Extra `summary.json` entries of this algorithm."""


@runtime_checkable
class Personalizes(Protocol):
    def personalize(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """`initial_accuracy` and `personal_accuracy` (each with `_std`) over clients, from the
        policy's own personal models; without it, `base.fine_tuned_head` scores the global model."""


@runtime_checkable
class DrivesRounds(Protocol):
    def open_driver(self, state: ServerState, round: Round, tasks: Sequence[ClientTask]) -> RoundDriver | None:
        """A server-in-the-loop driver for the round (split learning's top model), or None when
        each client trains on its own (`ClientProcedure.run`)."""


@runtime_checkable
class Sums(Protocol):
    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """One accepted client's share of the round's sum, float64 arrays (FedAvg's n_k x_k and n_k,
        HeteroFL's sums and counts): the round's `aggregate` gets their total, added up where the
        clients trained (one partial sum per group of clients), and results without weights."""


@runtime_checkable
class Costs(Protocol):
    def client_cost(self, task: ClientTask, result: ClientResult) -> tuple[float, int, int]:
        """(training FLOPs, bytes down, bytes up) of one client's round on the virtual clock (also
        what `clock: emulate` paces the client by); without it, `train_cost`."""


def train_cost(context: FederationContext, task: ClientTask, result: ClientResult) -> tuple[float, int, int]:
    """A client's round by default: its model variant's training FLOPs for every sample it
    processed, the task's weights down and the result's up."""
    flops = context.cost_of(task.model).train_flops * result.num_samples
    return flops, nbytes(task.weights), nbytes(result.weights)


@dataclass(frozen=True)
class ClientAccount:
    """The accounting done for the server where each client trains (in this process, or on a
    client actor): it ships with the federation, built once from the policy's `Costs` and `Sums`.

    `cost(task, result)` is what a client's round costs on the virtual clock; `summand(result)`,
    for a policy whose aggregate is a sum, is one accepted client's share of that sum (None
    otherwise: each result travels whole). Whether a call's clients are summed where they ran is
    the scheduler's to say (a synchronous round's are; a deadline or asynchronous server chooses
    updates by their arrival, so they come back whole)."""

    cost: Callable[[ClientTask, ClientResult], tuple[float, int, int]]
    summand: Callable[[ClientResult], dict[str, np.ndarray]] | None = None

    @classmethod
    def of(cls, policy: Any) -> ClientAccount:
        """The policy's account; a capability set to None (`summand = None` in a subclass of a
        summing policy) is opted out of."""
        cost = policy.client_cost if callable(getattr(policy, "client_cost", None)) else None
        summand = policy.summand if callable(getattr(policy, "summand", None)) else None
        return cls(cost or partial(train_cost, policy.context), summand)

    @property
    def sums(self) -> bool:
        return self.summand is not None

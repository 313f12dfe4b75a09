"""Clients in flight on the virtual clock: what the deadline and asynchronous schedulers share.

A `Flight` is a task out on a device: the model version it was built from, when it was
dispatched and when it arrives. `Pending` is what such a scheduler checkpoints besides the
server state: the flights still out and the server states they were built from, so a resumed
run configures the same tasks again, trains them again (every draw is keyed) and goes on
exactly as a run that never stopped. `merge_arrivals` turns arrived updates into the policy's
aggregate, each moved onto the current model by the scheduler's rule (`staleness`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..algorithms.aggregate import add_up
from ..algorithms.messages import ClientResult, ClientTask, ServerState
from ..statetypes import state_type
from ..types import ClientId, Round
from .federation import Federation
from .host import Settled
from .round import client_row


@state_type
@dataclass(frozen=True)
class Flight:
    """One task out on a device."""

    client_id: ClientId
    version: int
    """The model version (server steps taken) its task was built from; the task's round is version + 1."""
    dispatched_at: float
    arrives_at: float
    slot: int = 0
    """Async: the concurrency slot it fills (a finished client's replacement takes its slot)."""
    carry: bool = True
    """Deadline: whether its update counts when it arrives (`late: carry`) or is dropped."""

    @property
    def key(self) -> tuple[float, ClientId]:
        """Arrival order: the virtual time, ties broken by client id."""
        return (self.arrives_at, self.client_id)


@state_type
@dataclass(frozen=True)
class Pending:
    """What a deadline or asynchronous run checkpoints besides its server state."""

    flights: tuple[Flight, ...] = ()
    states: Mapping[int, ServerState] = field(default_factory=dict)
    """The server state of each version a flight whose outcome still counts was built from."""
    dispatched: int = 0
    """Async: tasks dispatched so far (each replacement's draw is keyed by its number)."""


def reconfigure(fed: Federation, flight: Flight, states: Mapping[int, ServerState]) -> ClientTask:
    """A flight's task, configured again from the state it was built from (as it was then)."""
    return fed.policy.configure(states[flight.version], flight.version + 1, [flight.client_id])[0]


def flight_row(
    fed: Federation, task: ClientTask, record: Settled, flight: Flight, rnd: Round, staleness: float
) -> dict[str, Any]:
    """A client's row with the virtual clock's columns: the round (server step) it is recorded
    in, the version it trained from, its staleness, when it left and arrived, its slot."""
    row = client_row(fed, task, record)
    row.update(
        round=rnd,
        model_version=flight.version,
        staleness=staleness,
        dispatched_at=flight.dispatched_at,
        arrived_at=flight.arrives_at,
        slot=flight.slot,
    )
    return row


Rebase = Callable[[ClientResult, ClientTask, int], ClientResult]
"""The scheduler's rule for an arrived update (result, its task, its staleness): the result as if
trained from the current model (`staleness`: FedAsync's mix, FedBuff's rebase, a carried update's)."""


def merge_arrivals(
    fed: Federation,
    state: ServerState,
    rnd: Round,
    arrivals: Sequence[tuple[ClientResult, ClientTask, int]],
    move: Rebase,
) -> tuple[ServerState, list[ClientResult]]:
    """The policy's aggregate over arrived updates (result, its task, its staleness), in the order
    given, each moved onto `state`'s model by the scheduler's `move`; as in a synchronous round, a
    policy that `Sums` gets their summands' total and the results without weights. Returns the new
    state and the results aggregated."""
    moved = [move(r, t, s) for r, t, s in arrivals]
    if not fed.account.sums:
        return fed.policy.aggregate(state, rnd, moved, {}), moved
    total = add_up(fed.account.summand(r) for r in moved)
    results = [r.replace(weights={}) for r in moved]
    return fed.policy.aggregate(state, rnd, results, total), results


def staleness_columns(stale: Sequence[int], late: int) -> dict[str, Any]:
    """A step's own columns: the model version it makes is its round (added by the caller), the
    clients that missed it, and the staleness of the updates it aggregated."""
    return {
        "num_late": late,
        "mean_staleness": float(np.mean(stale)) if stale else math.nan,
        "max_staleness": int(max(stale)) if stale else 0,
    }

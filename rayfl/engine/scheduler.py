"""Schedulers: what happens next on the virtual clock, one per `federation.mode`.

A scheduler turns a federation, an executor and a starting state into the sequence of settled
rounds (server steps) that the loop (`loop.run_federation`) evaluates, records and
checkpoints. It decides which clients train when and when the server aggregates; the loop does
not know. `sync`: every round waits for its slowest client (`Synchronous`); `deadline`: rounds
close at the K-th update or a deadline (`deadline.Deadline`); `async`: FedAsync and FedBuff
(`asynchronous.Asynchronous`). docs/time.md describes the three.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Generator, Protocol

from ..algorithms.messages import ServerState
from .admission import Batteries
from .asynchronous import Asynchronous
from .deadline import Deadline
from .federation import Federation
from .round import Executor, RoundOutcome, dispatch, settle_round


class Scheduler(Protocol):
    def rounds(
        self,
        fed: Federation,
        executor: Executor,
        state: ServerState,
        virtual_time_s: float,
        pending: Any,
        batteries: Batteries,
    ) -> Generator[RoundOutcome, None, None]:
        """The settled (not yet evaluated) rounds after `state`, up to `federation.rounds`, each
        with the virtual clock at its end and what to checkpoint besides the state
        (`RoundOutcome.pending`, given back as `pending` on resume; `RoundOutcome.batteries`,
        given back as `batteries`, which the scheduler's dispatches update). While the loop
        handles a yielded round, the scheduler's next clients may already be training."""


class Synchronous:
    """Every round waits for all its clients (the slowest sets the round's virtual duration).
    Round r + 1's tasks go out before round r is yielded, so the clients' hosts never wait for
    round r's evaluation."""

    def rounds(
        self,
        fed: Federation,
        executor: Executor,
        state: ServerState,
        virtual_time_s: float,
        pending: Any,
        batteries: Batteries,
    ) -> Generator[RoundOutcome, None, None]:
        done: RoundOutcome | None = None
        sums = fed.account.sums  # a synchronous round takes every update: summed where it ran
        count = fed.config.federation.clients_per_round
        for rnd in range(state.round + 1, fed.config.federation.rounds + 1):
            next_round = dispatch(fed, state, rnd, executor, virtual_time_s, batteries, count=count, sums=sums)
            if done is not None:
                yield done
            done = replace(settle_round(fed, state, next_round, virtual_time_s), batteries=batteries.snapshot())
            state, virtual_time_s = done.state, done.row["virtual_time_s"]
        if done is not None:
            yield done


SCHEDULERS: dict[str, type[Scheduler]] = {"sync": Synchronous, "deadline": Deadline, "async": Asynchronous}

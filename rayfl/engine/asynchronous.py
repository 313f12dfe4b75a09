"""Asynchronous federations (`federation.mode: async`): FedAsync and FedBuff on the virtual clock.

`concurrency` clients are always in flight. A client dispatched at virtual time t against model
version v arrives at t + its planned time (`admission.planned_seconds`: download, local epochs,
upload on its device); arrivals are taken from a min-heap in order of time, ties broken by
client id. Each arrival joins the buffer and its slot is filled again at once by a client drawn
uniformly, keyed by (seed, dispatch number), among the eligible available clients neither in
flight nor already dispatched against the current version (a client trains once per version).
When the buffer holds `buffer_size` arrivals (FedBuff, Nguyen et al. 2022; FedAsync, Xie et al.
2019: one), the server steps: the policy's aggregate over the arrived updates, each moved onto
the current model by its staleness (`staleness.fedasync`, `staleness.fedbuff`), makes version v + 1 (a row of
`metrics.parquet`; `federation.rounds` counts these steps). A failed client's arrival counts
towards the buffer and adds no update, so the order of events never depends on training.

The order of events is a pure function of the seed, so what runs where does not matter: every
task dispatched against one version goes out in one batch of groups (`ray.clients_per_call`),
sent before the server waits for the next step's arrivals, and actors train whatever is queued
without waiting for the clock. A checkpoint keeps the flights still out and the states they
were built from (`flights.Pending`); a resumed run trains them again and goes on identically.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Generator

import numpy as np

from .. import rng
from ..algorithms.messages import ClientTask, ServerState
from ..algorithms.staleness import fedasync, fedbuff
from .admission import Batteries, admit, dropped, planned_seconds
from .federation import Federation
from .flights import Flight, Pending, Rebase, flight_row, merge_arrivals, reconfigure, staleness_columns
from .host import GroupOutcome, Settled
from .round import Executor, RoundOutcome, groups_of, round_row


def key(task: ClientTask) -> tuple[int, int]:
    return (task.client_id, task.round)


class AsyncServer:
    """The clients in flight of an asynchronous federation, and the server's state."""

    def __init__(
        self,
        fed: Federation,
        executor: Executor,
        state: ServerState,
        now: float,
        pending: Pending | None,
        batteries: Batteries,
    ):
        cfg = fed.config.federation
        self.fed, self.executor, self.state, self.now, self.last_step = fed, executor, state, now, now
        self.capacity = cfg.concurrency
        self.buffer_size = 1 if cfg.asynchronous.rule == "fedasync" else cfg.asynchronous.buffer_size
        pending = pending or Pending()
        self.heap: list[tuple[float, int, Flight]] = []
        self.states = dict(pending.states)
        self.dispatched = pending.dispatched
        self.this_version: set[int] = set()
        # by (client, round): a client may be out again, against a newer version, before the
        # server steps over its previous update
        self.tasks: dict[tuple[int, int], ClientTask] = {}
        self.unsent: list[ClientTask] = []
        self.batches: list[tuple[list[ClientTask], Callable[[], list[GroupOutcome]]] | None] = []
        self.batch_of: dict[tuple[int, int], int] = {}
        self.records: dict[tuple[int, int], Settled] = {}
        self.batteries = batteries
        self.declined: list[tuple[ClientTask, Settled, float]] = []
        for f in pending.flights:  # a resumed run: the same tasks, trained again (or dropped again)
            task = reconfigure(fed, f, self.states)
            self.launch(f, task, dropped(fed, task, f.dispatched_at))

    def launch(self, flight: Flight, task: ClientTask, held: Settled | None = None) -> None:
        """A flight out: its task trains, or, dropped (`held`), arrives at its dropout untrained."""
        heapq.heappush(self.heap, (flight.arrives_at, flight.client_id, flight))
        self.tasks[key(task)] = task
        if held is None:
            self.unsent.append(task)
        else:
            self.records[key(task)] = held

    def draw(self) -> int | None:
        """A client for a free slot, uniform among the eligible available clients that are
        neither in flight nor dispatched against this version (None when there is none)."""
        rnd = self.state.round + 1
        candidates = self.fed.policy.candidates(rnd, self.fed.population.available(rnd, self.now))
        busy = {f.client_id for *_, f in self.heap} | self.this_version
        g = rng.generator(self.fed.config.seed, "async-select", self.dispatched)
        for _ in range(32):  # a large population: a few draws find a free client
            if not len(candidates):
                return None
            c = int(candidates[int(g.integers(len(candidates)))])
            if c not in busy:
                return c
        free = np.setdiff1d(np.asarray(candidates), np.fromiter(busy, int))
        return int(g.choice(free)) if len(free) else None

    def fill(self) -> None:
        """Dispatch clients into the free slots, now, against the current version."""
        while len(self.heap) < self.capacity:
            client = self.draw()
            if client is None:
                return
            self.dispatched += 1
            self.this_version.add(client)
            task = self.fed.policy.configure(self.state, self.state.round + 1, [client])[0]
            run, held = admit(self.fed, [task], self.now, self.batteries)
            if held and held[0].status == "skipped":  # declined: no slot taken, recorded at the next step
                self.declined.append((task, held[0], self.now))
                continue
            slot = min(set(range(self.capacity)) - {f.slot for *_, f in self.heap})
            took = held[0].cut_s if held else planned_seconds(self.fed, task)
            self.launch(
                Flight(client, self.state.round, self.now, self.now + took, slot), task, held[0] if held else None
            )
            self.states[self.state.round] = self.state

    def advance(self) -> list[Flight]:
        """The arrivals that make the next server step, each slot filled again as it frees."""
        arrived: list[Flight] = []
        while len(arrived) < self.buffer_size:
            self.fill()
            if not self.heap:  # nobody left to wait for: the step takes what has come
                break
            _, _, flight = heapq.heappop(self.heap)
            self.now = flight.arrives_at
            arrived.append(flight)
        return arrived

    def submit(self) -> None:
        """Send the tasks dispatched since the last call, in groups, to train now."""
        if self.unsent:
            self.batch_of.update((key(t), len(self.batches)) for t in self.unsent)
            self.batches.append(
                (self.unsent, self.executor.submit(groups_of(self.unsent, self.fed.config.call_size), sums=False))
            )
            self.unsent = []

    def record(self, task: ClientTask) -> Settled:
        """A task's settled outcome, waiting for its batch if need be."""
        k = key(task)
        if k not in self.records:
            b = self.batch_of[k]
            tasks, collect = self.batches[b]
            self.records.update((key(t), r) for t, r in zip(tasks, (r for g in collect() for r in g.settled)))
            self.batches[b] = None  # its tasks' weights and the executor's references go
        self.batch_of.pop(k, None)
        return self.records.pop(k)

    def rule(self, state: ServerState) -> Rebase:
        """The server's rule for an arrived update: FedAsync's mix into `state`'s model, or FedBuff's
        staleness-scaled delta on it (`staleness`)."""
        cfg, params = self.fed.config.federation, self.fed.context.param_names
        if cfg.asynchronous.rule == "fedasync":
            alpha = cfg.asynchronous.mixing
            return lambda result, task, s: fedasync(result, state.weights, s, cfg.staleness, alpha)
        return lambda result, task, s: fedbuff(result, task.weights, state.weights, s, cfg.staleness, params)

    def step(self, arrived: list[Flight]) -> RoundOutcome:
        """The server step over the arrived clients: aggregate, record, checkpoint what is out."""
        state, rnd = self.state, self.state.round + 1
        tasks = [self.tasks.pop((f.client_id, f.version + 1)) for f in arrived]
        done = [(f, t, self.record(t), state.round - f.version) for f, t in zip(arrived, tasks)]
        arrivals = [(r.outcome, t, s) for _, t, r, s in done if r.status == "ok"]
        new, accepted = merge_arrivals(self.fed, state, rnd, arrivals, self.rule(state))
        rows = [flight_row(self.fed, t, r, f, rnd, s) for f, t, r, s in done]
        rows += [
            flight_row(self.fed, t, r, Flight(t.client_id, t.round - 1, at, at, -1), rnd, math.nan)
            for t, r, at in self.declined
        ]
        self.declined = []
        row = round_row(
            self.fed,
            new,
            rnd,
            rows,
            accepted,
            len(done),
            [t for _, t, _, _ in done],
            self.now,
            self.now - self.last_step,
            [],
        )
        row.update(model_version=rnd, **staleness_columns([s for _, _, r, s in done if r.status == "ok"], 0))
        self.state, self.last_step, self.this_version = new, self.now, set()
        out = sorted((f for *_, f in self.heap), key=lambda f: f.key)
        self.states = {v: s for v, s in self.states.items() if any(f.version == v for f in out)}
        return RoundOutcome(
            new, row, rows, Pending(tuple(out), dict(self.states), self.dispatched), self.batteries.snapshot()
        )


class Asynchronous:
    """Server steps as arrivals fill the buffer. The tasks of the next step go out before this
    one is yielded, so the clients' hosts train while the loop evaluates and records."""

    def rounds(
        self,
        fed: Federation,
        executor: Executor,
        state: ServerState,
        virtual_time_s: float,
        pending: Pending | None,
        batteries: Batteries,
    ) -> Generator[RoundOutcome, None, None]:
        queue = AsyncServer(fed, executor, state, virtual_time_s, pending, batteries)
        done: RoundOutcome | None = None
        while queue.state.round < fed.config.federation.rounds:
            arrived = queue.advance()
            queue.submit()
            if done is not None:
                yield done
            done = queue.step(arrived)
        if done is not None:
            yield done

"""The Ray executor, in the coordinator's process: any idle client actor takes the next group.

The executor puts each distinct weights dict in the object store once per round and passes
the reference, so every actor reads the same arrays zero-copy. Tasks travel in groups
(`ray.clients_per_call` clients per actor call), each run by the core's `run_group`, which
returns one partial sum for the group where the scheduler says the call sums. A group whose
actor dies goes to another; the actor gets no work until it answers again (Ray restarts it).
A failure of the infrastructure never passes for a finished round: see `RayExecutor`. Under
`clock: emulate` an actor that finished early holds until its clients' scaled virtual times
have passed. A server-in-the-loop round pins each session to one actor and relays the driver's
calls (`ActorRelay`); the executor knows nothing of what they carry.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError

from rayfl.algorithms.capabilities import ClientAccount
from rayfl.algorithms.exchange import RoundDriver, per_session
from rayfl.algorithms.messages import ClientFailure, ClientResult, ClientTask
from rayfl.engine.host import GroupOutcome, exchange_failed, failed_all, settle_all
from rayfl.engine.round import HoldSeconds

from ..names import FederationRef

log = logging.getLogger("rayfl")

LOST = (RayActorError, ObjectLostError)
"""A call whose actor died (killed, its node lost, restarting), or whose finished result was lost
with its node before it was read (an actor task's result is not reconstructed): run it again."""


class ActorsLost(RuntimeError):
    """The client actors could not carry the run: none answered within `ray.actor_timeout_s`, or
    a round kept losing more than `federation.max_failed_fraction` of its clients to dying actors."""


class Abandoned(RuntimeError):
    """The run was told to stop (`Coordinator.abandon`: its driver is gone)."""


class RayExecutor:
    """Dispatches a round's groups of clients over client actors, first idle actor first.

    An actor whose call died (killed, its node lost, restarting) is given no work until it
    answers a probe (`ClientActor.ready`) again, then takes work again; the group it held goes to
    another actor. A group counts a try only when an actor that had answered fails it; after
    `max_attempts` tries its clients are lost to the infrastructure. Where more than
    `max_failed_fraction` of a submission's clients are lost, the lost groups are run again
    (they give the same results: every draw is keyed by round and client) up to `max_attempts`
    times, and said so through `report`; then `ActorsLost`. With no actor answering, the executor
    waits for Ray to restart or replace them, reporting every 5 s, at most `timeout_s`
    (`ray.actor_timeout_s`); then `ActorsLost`."""

    def __init__(
        self,
        actors: Sequence[ray.actor.ActorHandle],
        federation: FederationRef,
        account: ClientAccount,
        max_attempts: int = 3,
        timeout_s: float = 600.0,
        max_failed_fraction: float = 0.5,
        report: Callable[[str], None] = log.warning,
        stop: threading.Event | None = None,
    ):
        self.actors = list(actors)
        self.federation = federation
        self.account = account
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.max_failed_fraction = max_failed_fraction
        self.report = report
        self.stop = stop  # set: the next wait for clients raises `Abandoned`
        self.down: set[int] = set()  # ids of the actors whose last call died and that have not answered since
        self.turn = 0  # where the next submission starts among the actors

    def alive(self) -> int:
        """The run's client actors that answer (their last call did not die, or a probe since did)."""
        return sum(id(a) not in self.down for a in self.actors)

    def put_weights(self, tasks: Sequence[ClientTask]) -> dict[int, ray.ObjectRef]:
        """Each distinct weights dict of the round in the object store once, by id."""
        refs: dict[int, ray.ObjectRef] = {}
        for task in tasks:
            if id(task.weights) not in refs:
                refs[id(task.weights)] = ray.put(dict(task.weights))
        return refs

    def submit(
        self, groups: Sequence[Sequence[ClientTask]], *, sums: bool, hold_s: HoldSeconds | None = None
    ) -> Callable[[], list[GroupOutcome]]:
        """Send the first groups to the idle actors now (each summed where it runs with `sums`); the
        returned call feeds the rest to actors as they free up and returns every group's outcome
        in group order."""
        work = GroupCalls(self, groups, sums, hold_s)
        work.feed()
        self.turn += len(groups)  # submissions overlap (asynchronous federations): spread them
        return work.collect

    def failed(self, group: Sequence[ClientTask], reason: str) -> GroupOutcome:
        """A group whose call failed as a whole: each client failed, having downloaded the model."""
        return settle_all(self.account, zip(group, failed_all(group, reason)))

    def wait_until_up(self, actors: Sequence[ray.actor.ActorHandle]) -> None:
        """Block until each of `actors` answers a probe (`ActorsLost` after `timeout_s`, a report every 5 s)."""
        started = reported = time.monotonic()
        waiting = list(actors)
        while waiting:
            try:  # bounded: a call to an actor Ray cannot place again (its node gone) waits forever
                ray.get(
                    [a.ready.remote() for a in waiting], timeout=max(1.0, self.timeout_s - (time.monotonic() - started))
                )
            except (RayActorError, ray.exceptions.GetTimeoutError):
                now = time.monotonic()
                if now - started > self.timeout_s:
                    raise ActorsLost(
                        f"client actors did not answer within ray.actor_timeout_s = {self.timeout_s:g} s"
                    ) from None
                if now - reported >= 5.0:
                    self.report(
                        f"waiting {now - started:.0f} s for Ray to restart client actors (ray.actor_timeout_s = "
                        f"{self.timeout_s:g} s)"
                    )
                    reported = now
                time.sleep(0.5)
                continue
            self.down -= {id(a) for a in waiting}
            waiting = []

    def exchange(self, tasks: Sequence[ClientTask], driver: RoundDriver) -> list[ClientResult | ClientFailure]:
        """A server-in-the-loop round with every client's session pinned to one actor for the
        round (round-robin in task order over the actors that answer). An actor runs its calls in
        order; an error in a session fails every session of the round. When an actor dies, the
        round's exchange runs again from the driver's state at its start, on the actors that
        answer (`max_attempts` times; then `ActorsLost`)."""
        if not tasks:
            return []
        refs = self.put_weights(tasks)
        start = copy.deepcopy(driver.__dict__)  # the driver as the round opened it
        for attempt in range(1, self.max_attempts + 1):
            homes = [(actor, t.client_id) for actor, t in zip(itertools.cycle(self.answering()), tasks)]
            relay = ActorRelay(homes)
            relay.pending = [
                a.open_session.remote(self.federation, dataclasses.replace(t, weights={}), refs[id(t.weights)])
                for (a, _), t in zip(homes, tasks)
            ]
            try:
                driver.drive(relay)
                ray.get(relay.pending)
                return ray.get([a.close_session.remote(c) for a, c in homes])
            except RayTaskError as exc:
                return exchange_failed(tasks, f"{type(exc.cause).__name__}: {exc.cause}")
            except LOST as exc:
                self.down |= {id(a) for a, _ in homes}
                if attempt == self.max_attempts:
                    raise ActorsLost(
                        f"round {tasks[0].round}: a client actor died in each of {attempt} tries of its exchange "
                        f"({type(exc).__name__})"
                    ) from None
                self.report(
                    f"round {tasks[0].round}: a client actor died in its exchange ({type(exc).__name__}); running "
                    "the round's exchange again"
                )
                driver.__dict__.update(copy.deepcopy(start))
        raise AssertionError("unreachable")

    def answering(self) -> list[ray.actor.ActorHandle]:
        """The actors not known to be down, after the down ones had half a second to answer a
        probe (a session pinned to one Ray cannot place again would wait for ever); when none
        answers, every actor once they all do (`wait_until_up`)."""
        probes = {a.ready.remote(): a for a in self.actors if id(a) in self.down}
        for ref in ray.wait(list(probes), num_returns=len(probes), timeout=0.5)[0] if probes else []:
            try:
                ray.get(ref)
                self.down.discard(id(probes[ref]))
            except RayActorError:
                pass
        up = [a for a in self.actors if id(a) not in self.down]
        if not up:
            self.wait_until_up(self.actors)
            up = list(self.actors)
        return up


class ActorRelay:
    """A relay to sessions on client actors: one call per actor carries all its sessions' calls,
    and the actors run theirs at once; the replies of `post`ed calls are awaited only before the
    next call, so work overlaps across actors."""

    def __init__(self, homes: Sequence[tuple[ray.actor.ActorHandle, int]]):
        self.homes = list(homes)
        self.by_actor: dict[Any, list[int]] = {}  # actor -> its sessions' positions in task order
        for position, (actor, _) in enumerate(self.homes):
            self.by_actor.setdefault(actor, []).append(position)
        self.pending: list[ray.ObjectRef] = []

    def send(self, method: str, args: Sequence[tuple] | None) -> list[ray.ObjectRef]:
        per = per_session(args, len(self.homes), method)
        return [
            actor.session_calls.remote(method, [(self.homes[p][1], per[p]) for p in positions])
            for actor, positions in self.by_actor.items()
        ]

    def call(self, method: str, args: Sequence[tuple] | None = None) -> list[Any]:
        refs = self.send(method, args)
        ray.get(self.pending)  # surfaces a failed earlier call; the new calls already queue behind it
        self.pending = []
        replies: list[Any] = [None] * len(self.homes)
        for positions, answers in zip(self.by_actor.values(), ray.get(refs)):
            for p, answer in zip(positions, answers):
                replies[p] = answer
        return replies

    def post(self, method: str, args: Sequence[tuple] | None = None) -> None:
        self.pending += self.send(method, args)


class GroupCalls:
    """One submission's groups in flight on a `RayExecutor`'s actors, with the probes of the
    actors that stopped answering and the pacing holds of `clock: emulate`."""

    def __init__(
        self, executor: RayExecutor, groups: Sequence[Sequence[ClientTask]], sums: bool, hold_s: HoldSeconds | None
    ):
        self.ex, self.sums, self.hold_s = executor, sums, hold_s
        self.refs = executor.put_weights([t for g in groups for t in g])
        self.groups = list(groups)
        self.pending = deque(enumerate(groups))
        self.idle = deque(a for a in executor.actors if id(a) not in executor.down)
        self.idle.rotate(-executor.turn)
        self.probes: list[tuple[float, ray.actor.ActorHandle]] = [
            (0.0, a) for a in executor.actors if id(a) in executor.down
        ]  # (when, actor)
        self.inflight: dict[
            ray.ObjectRef, tuple[str, ray.actor.ActorHandle, int, float]
        ] = {}  # kind, actor, group, sent at
        self.attempts: dict[int, int] = {}  # tries per group, each on an actor that had answered
        self.lost: set[int] = set()  # groups that used up their tries
        self.runs = 1  # runs of the lost groups
        self.out: dict[int, GroupOutcome] = {}
        self.starved: float | None = None  # since when no actor answers while work waits
        self.reported = 0.0

    def feed(self) -> None:
        now = time.monotonic()
        for due, actor in [p for p in self.probes if p[0] <= now]:
            self.probes.remove((due, actor))
            self.inflight[actor.ready.remote()] = ("probe", actor, -1, now)
        while self.pending and self.idle:
            k, group = self.pending.popleft()
            actor = self.idle.popleft()
            light = [dataclasses.replace(t, weights={}) for t in group]
            weights = [self.refs[id(t.weights)] for t in group]
            call = actor.run_group.options(
                name=f"round{group[0].round}/clients{group[0].client_id}-{group[-1].client_id}"
            )
            self.inflight[call.remote(self.ex.federation, light, weights, sums=self.sums)] = ("group", actor, k, now)

    def busy(self) -> bool:
        """Groups wait or run, or actors hold for their clients' paced time (probes do not count)."""
        return bool(self.pending) or any(kind != "probe" for kind, *_ in self.inflight.values())

    def collect(self) -> list[GroupOutcome]:
        while self.busy() or self.run_lost_again():
            if self.ex.stop is not None and self.ex.stop.is_set():
                raise Abandoned(f"round {self.groups[0][0].round}: the run was abandoned")
            self.feed()
            self.starving()
            wait_s = min([5.0, *(max(0.0, due - time.monotonic()) for due, _ in self.probes)])
            ready = ray.wait(list(self.inflight), num_returns=1, timeout=wait_s)[0] if self.inflight else []
            if not ready:
                time.sleep(0.0 if self.inflight else wait_s)
                continue
            kind, actor, k, sent = self.inflight.pop(ready[0])
            try:
                outcome = ray.get(ready[0])
            except LOST:  # killed, its node lost (its result too), or restarting: no work until a probe answers
                self.ex.down.add(id(actor))
                self.probes.append((time.monotonic() + (1.0 if kind == "probe" else 0.0), actor))
                if kind == "group":
                    self.retry(k)
                continue
            except RayTaskError as exc:  # an error outside the client-outcome logic: a group's clients fail
                self.idle.append(actor)
                if kind == "group":  # a pacing hold or a probe that raised leaves the outcomes as they are
                    self.out[k] = self.ex.failed(self.groups[k], f"{type(exc.cause).__name__}: {exc.cause}")
                continue
            self.ex.down.discard(id(actor))
            if kind == "group":
                self.out[k] = outcome
                hold = self.hold_s(outcome) - (time.monotonic() - sent) if self.hold_s is not None else 0.0
                if hold > 0:
                    self.inflight[actor.hold.options(name=f"round{self.groups[k][0].round}/hold").remote(hold)] = (
                        "hold",
                        actor,
                        k,
                        0.0,
                    )
                    continue
            self.idle.append(actor)  # a group done, a pacing hold ended, or a probe answered (the actor rejoins)
        return [self.out[k] for k in range(len(self.groups))]

    def retry(self, k: int) -> None:
        self.attempts[k] = self.attempts.get(k, 0) + 1
        if self.attempts[k] < self.ex.max_attempts:
            self.pending.append((k, self.groups[k]))
        else:
            self.lost.add(k)

    def run_lost_again(self) -> bool:
        """Once every group settled: whether the lost groups run again (more than
        `max_failed_fraction` of the clients lost, `max_attempts` runs at most, then `ActorsLost`);
        else their clients are recorded as failed."""
        if not self.lost:
            return False
        lost, total = sum(len(self.groups[k]) for k in self.lost), sum(map(len, self.groups))
        rnd, fraction = self.groups[min(self.lost)][0].round, self.ex.max_failed_fraction
        if lost <= fraction * total:
            for k in self.lost:
                self.out[k] = self.ex.failed(
                    self.groups[k], f"client actors died {self.ex.max_attempts} times running it"
                )
            self.lost.clear()
            return False
        if self.runs == self.ex.max_attempts:
            raise ActorsLost(
                f"round {rnd}: {lost} of {total} clients lost to dying client actors in each of {self.runs} runs "
                f"(federation.max_failed_fraction = {fraction:g})"
            )
        self.ex.report(
            f"round {rnd}: {lost} of {total} clients lost to dying client actors (more than "
            f"federation.max_failed_fraction = {fraction:g}): running them again"
        )
        self.runs += 1
        for k in sorted(self.lost):
            self.attempts[k] = 0
            self.pending.append((k, self.groups[k]))
        self.lost.clear()
        return True

    def starving(self) -> None:
        """While work waits and no actor answers: a report every 5 s, `ActorsLost` after `timeout_s`."""
        if not (self.pending and not self.idle and not any(kind != "probe" for kind, *_ in self.inflight.values())):
            self.starved = None
            return
        now = time.monotonic()
        if self.starved is None:
            self.starved = self.reported = now
        waited = now - self.starved
        if waited > self.ex.timeout_s:
            raise ActorsLost(
                f"no client actor answered for {waited:.0f} s (ray.actor_timeout_s = {self.ex.timeout_s:g} s)"
            )
        if now - self.reported >= 5.0:
            self.ex.report(
                f"no client actor answers: waiting {waited:.0f} s for Ray to restart or replace them "
                f"(ray.actor_timeout_s = {self.ex.timeout_s:g} s)"
            )
            self.reported = now

"""Pool sizing and the Ray executor: any idle client actor takes the next task.

The executor puts each distinct weights dict in the object store once per round and passes
the reference, so every actor reads the same arrays zero-copy. A group whose actor dies is
retried on another actor (a restarted actor rejoins the pool; one that fails `max_attempts`
calls in a row leaves it); after `max_attempts` tries the client is recorded as failed for
the round. Tasks travel in groups (`ray.clients_per_call` clients per actor call), each run by
the core's `run_group`, which returns one partial sum for the group where the algorithm's
aggregate is a sum. Under `clock: emulate` an actor that finished early holds until its
clients' scaled virtual times have passed. A server-in-the-loop round pins each session to one actor and
relays the driver's calls (`ActorRelay`); the executor knows nothing of what they carry.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from typing import Any, Callable, Mapping, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from rayfl.algorithms.base import ServerPolicy
from rayfl.algorithms.exchange import RoundDriver, per_session
from rayfl.algorithms.messages import ClientFailure, ClientResult, ClientTask
from rayfl.config import ConfigError, RunConfig
from rayfl.engine.host import GroupOutcome, exchange_failed, failed_all, settle_all
from rayfl.engine.round import Pace


def pool_size(config: RunConfig, available: Mapping[str, float]) -> int:
    """`num_actors: auto`: as many actors as the free CPUs and GPUs hold, at most the round size."""
    ray_cfg = config.ray
    if ray_cfg.num_actors != "auto":
        return ray_cfg.num_actors
    fits = [config.federation.clients_per_round, math.floor(available.get("CPU", 0) / ray_cfg.cpus_per_actor + 1e-9)]
    if ray_cfg.gpus_per_actor > 0:
        fits.append(math.floor(available.get("GPU", 0) / ray_cfg.gpus_per_actor + 1e-9))
    size = min(fits)
    if size < 1:
        have = {k: available.get(k, 0) for k in ("CPU", "GPU")}
        raise ConfigError(
            f"ray: no room for one client actor (cpus_per_actor={ray_cfg.cpus_per_actor}, "
            f"gpus_per_actor={ray_cfg.gpus_per_actor}; free {have})"
        )
    return size


def check_fits(config: RunConfig, count: int, cluster: Mapping[str, float], most: Mapping[str, float] | None) -> None:
    """`ConfigError` naming `ray.num_actors` when `count` client actors can never be placed: beyond
    the cluster's total resources (`most` is None: a fixed-size cluster) or beyond the most an
    autoscaling cluster can grow to (`most`)."""
    limit = cluster if most is None else most
    per = {"CPU": config.ray.cpus_per_actor, "GPU": config.ray.gpus_per_actor}
    for key, each in per.items():
        need, have = count * each, float(limit.get(key, 0))
        if need > have + 1e-9:
            grows = "" if most is None else " even at its largest"
            raise ConfigError(f"ray.num_actors: {count} client actors x {each:g} {key} need {need:g} {key}; the cluster has {have:g}{grows}")


def wait_for_actors(
    actors: Sequence[ray.actor.ActorHandle], timeout_s: float, report: Callable[[str], None], every_s: float = 5.0, federation_ref: ray.ObjectRef | None = None
) -> None:
    """Block until every client actor is up (and, given the federation, warmed: `ClientActor.warm`),
    reporting what is still pending every `every_s` seconds (actors that fit the cluster may wait
    for free resources or new nodes); `RuntimeError` after `timeout_s` (`ray.actor_timeout_s`). An
    actor whose constructor failed raises here."""
    refs = [a.info.remote() if federation_ref is None else a.warm.remote([federation_ref]) for a in actors]
    owner = dict(zip(refs, actors))
    started = time.monotonic()
    while True:
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=every_s)
        ray.get(ready)
        if not pending:
            return
        waited = time.monotonic() - started
        available = ray.available_resources()
        free = {k: round(available.get(k, 0.0), 3) for k in ("CPU", "GPU") if k in ray.cluster_resources()}
        if waited >= timeout_s:
            raise RuntimeError(f"{len(pending)} of {len(refs)} client actors did not start within ray.actor_timeout_s = {timeout_s:g} s (free now: {free})")
        unplaced = sum(not placed(owner[ref]) for ref in pending)  # the others are placed, starting or warming up
        if unplaced:
            report(f"waiting {waited:.0f} s for {unplaced} of {len(refs)} client actors to be placed (free now: {free}; timeout ray.actor_timeout_s = {timeout_s:g} s)")


def placed(actor: ray.actor.ActorHandle) -> bool:
    """Whether Ray has given the actor a worker process (its constructor may still be running).
    Read from the GCS's actor table (`ray._private.state`: the public State API needs the
    dashboard); an actor Ray cannot say anything about counts as unplaced."""
    from ray._private import state

    try:
        return int(state.actors(actor._actor_id.hex()).get("Pid", 0)) > 0
    except Exception:  # noqa: BLE001 - an internal table: any failure means "unknown"
        return False


class RayExecutor:
    """Dispatches a round's groups of clients over client actors, first idle actor first."""

    def __init__(self, actors: Sequence[ray.actor.ActorHandle], federation_ref: ray.ObjectRef, policy: ServerPolicy, max_attempts: int = 3):
        self.actors = list(actors)
        self.box = [federation_ref]  # boxed: each actor resolves it itself, once
        self.policy = policy
        self.max_attempts = max_attempts
        self.down: set[int] = set()  # ids of the actors whose last call died (restarting, or gone)
        self.turn = 0  # where the next submission starts among the actors

    def alive(self) -> int:
        """Client actors in the pool whose last call did not die."""
        return sum(id(a) not in self.down for a in self.actors)

    def put_weights(self, tasks: Sequence[ClientTask]) -> dict[int, ray.ObjectRef]:
        """Each distinct weights dict of the round in the object store once, by id."""
        refs: dict[int, ray.ObjectRef] = {}
        for task in tasks:
            if id(task.weights) not in refs:
                refs[id(task.weights)] = ray.put(dict(task.weights))
        return refs

    def submit(self, groups: Sequence[Sequence[ClientTask]], pace: Pace | None = None) -> Callable[[], list[GroupOutcome]]:
        """Send the first groups to the idle actors now; the returned call feeds the rest to actors
        as they free up (a group whose actor dies goes to another, `max_attempts` times; then its
        clients fail) and returns every group's outcome in group order."""
        work = _Dispatch(self, groups, pace)
        work.feed()
        self.turn += len(groups)  # submissions overlap (asynchronous federations): spread them
        return work.gather

    def failed(self, group: Sequence[ClientTask], reason: str) -> GroupOutcome:
        """A group whose call failed as a whole: each client failed, having downloaded the model."""
        return settle_all(self.policy, group, failed_all(group, reason))

    def exchange(self, tasks: Sequence[ClientTask], driver: RoundDriver) -> list[ClientResult | ClientFailure]:
        """A server-in-the-loop round with every client's session pinned to one actor for the
        round (round-robin in task order). An actor runs its calls in order; an error in a
        session or a dying actor fails every session of the round (no retry mid-round)."""
        if not tasks:
            return []
        refs = self.put_weights(tasks)
        homes = [(self.actors[i % len(self.actors)], t.client_id) for i, t in enumerate(tasks)]
        relay = ActorRelay(homes)
        relay.pending = [a.open_session.remote(self.box, dataclasses.replace(t, weights={}), refs[id(t.weights)]) for (a, _), t in zip(homes, tasks)]
        try:
            driver.drive(relay)
            ray.get(relay.pending)
            results = ray.get([a.close_session.remote(c) for a, c in homes])
            self.down -= {id(a) for a, _ in homes}
            return results
        except RayTaskError as exc:
            return exchange_failed(tasks, f"{type(exc.cause).__name__}: {exc.cause}")
        except RayActorError as exc:
            self.down |= {id(a) for a, _ in homes if a._actor_id.hex() == exc.actor_id}
            return exchange_failed(tasks, f"a client actor died ({type(exc).__name__})")


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
        return [actor.session_calls.remote(method, [(self.homes[p][1], per[p]) for p in positions]) for actor, positions in self.by_actor.items()]

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


class _Dispatch:
    """One round's groups in flight on a `RayExecutor`'s actors."""

    def __init__(self, executor: RayExecutor, groups: Sequence[Sequence[ClientTask]], pace: Pace | None):
        self.ex, self.pace = executor, pace
        self.refs = executor.put_weights([t for g in groups for t in g])
        self.pending = deque(enumerate(groups))
        self.idle = deque(executor.actors)
        self.idle.rotate(-executor.turn)
        self.attempts: dict[int, int] = {}
        self.strikes: dict[int, int] = {}  # consecutive failed calls per actor
        self.inflight: dict[ray.ObjectRef, tuple[ray.actor.ActorHandle, int | None, float]] = {}
        self.out: dict[int, GroupOutcome] = {}
        self.groups = list(groups)

    def feed(self) -> None:
        while self.pending and self.idle:
            k, group = self.pending.popleft()
            actor = self.idle.popleft()
            light = [dataclasses.replace(t, weights={}) for t in group]
            weights = [self.refs[id(t.weights)] for t in group]
            call = actor.run_group.options(name=f"round{group[0].round}/clients{group[0].client_id}-{group[-1].client_id}")
            self.inflight[call.remote(self.ex.box, light, weights)] = (actor, k, time.perf_counter())

    def gather(self) -> list[GroupOutcome]:
        while self.pending or self.inflight:
            self.feed()
            if not self.inflight:  # every actor is gone
                for k, group in self.pending:
                    self.out[k] = self.ex.failed(group, "no client actor left")
                break
            ready, _ = ray.wait(list(self.inflight), num_returns=1)
            actor, k, started = self.inflight.pop(ready[0])
            if k is None:  # a pacing hold ended: the actor is free again (or restarting, if it died)
                try:
                    ray.get(ready[0])
                except RayActorError:
                    self.ex.down.add(id(actor))
                self.idle.append(actor)
                continue
            try:
                outcome = ray.get(ready[0])
                self.strikes[id(actor)] = 0
                self.ex.down.discard(id(actor))
            except RayActorError:
                self.ex.down.add(id(actor))
                self.strikes[id(actor)] = self.strikes.get(id(actor), 0) + 1
                if self.strikes[id(actor)] < self.ex.max_attempts:
                    self.idle.append(actor)
                else:
                    self.ex.actors.remove(actor)
                self.attempts[k] = self.attempts.get(k, 0) + 1
                if self.attempts[k] < self.ex.max_attempts:
                    self.pending.append((k, self.groups[k]))
                else:
                    self.out[k] = self.ex.failed(self.groups[k], f"actor died {self.ex.max_attempts} times")
                continue
            except RayTaskError as exc:
                self.ex.down.discard(id(actor))
                self.idle.append(actor)
                self.out[k] = self.ex.failed(self.groups[k], f"{type(exc.cause).__name__}: {exc.cause}")
                continue
            self.out[k] = outcome
            hold = self.pace(outcome) - (time.perf_counter() - started) if self.pace is not None else 0.0
            if hold > 0:
                self.inflight[actor.hold.options(name=f"round{self.groups[k][0].round}/pace").remote(hold)] = (actor, None, 0.0)
            else:
                self.idle.append(actor)
        return [self.out[k] for k in range(len(self.groups))]

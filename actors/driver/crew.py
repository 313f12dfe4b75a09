"""A run's actors: its coordinator host and client actors, borrowed from the cluster's warm pool
(`actors/keeper.py`) or started for the run alone (`assemble`), waited for until they answer
(`wait_for_actors`), and given back or killed when the run ends (`release`).

How many client actors and what each takes is the config's `Resources` (`RunConfig.resources`),
read once: `ray.num_actors`, or under `auto` as many as the free resources and the pool's idle
actors hold.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from rayfl.config import ConfigError, RunConfig

from .. import raystate
from ..client import ClientActor
from ..coordinator.actor import Coordinator
from ..keeper import Lent, Started
from ..names import HEAD_RESOURCE, NAMESPACE, FederationRef, actor_name, kinds, pooled_name
from . import pool
from .follow import Cancelled


@dataclass
class RunActors:
    """The coordinator (first in `names`) and the client actors of one run; `lease` names its
    booking in the pool, None for actors of this run alone."""

    coordinator: Any
    clients: list
    names: list[str]
    key: str
    lease: str | None = None


def assemble(config: RunConfig, run_id: str, pooled: bool) -> RunActors:
    """The run's actors: `ray.num_actors` client actors (under `auto`, as many as the free
    resources and the pool's idle actors hold; `ConfigError` when the asked number can never fit
    the cluster, or `ray.coordinator_node` names a resource no node has) and a coordinator host.
    `pooled`: the pool's idle actors of the run's kinds first, new pooled ones for the rest;
    else new ones named after the run (a suffix when a live run has that name: RUN_DIRs a/run
    and b/run)."""
    room = dict(ray.available_resources())
    keeper = pool.keeper() if pooled else None
    if keeper is not None:
        for key, value in pool.ask(lambda k: k.idle_resources.remote(), keeper).items():
            room[key] = room.get(key, 0.0) + value
    resources = config.resources
    count = resources.count(room)
    most = raystate.max_resources()
    resources.check_fits(count, ray.cluster_resources() if most is None else most, grows=most is not None)
    node = config.ray.coordinator_node
    if node not in ("head", "any") and node not in ray.cluster_resources():
        raise ConfigError(f"ray.coordinator_node: no node of the cluster has a resource {node!r}")
    if keeper is None:
        return own_actors(config, run_id, count)
    return borrowed_actors(config, run_id, count, keeper)


def own_actors(config: RunConfig, key: str, count: int) -> RunActors:
    own = [actor_name(key, "coordinator"), *(actor_name(key, f"client-{k}") for k in range(count))]
    try:
        clients = create_client_actors(config, own[1:], pooled=False)
    except ray.exceptions.ActorAlreadyExistsError:  # a run of that name is live on the cluster
        return own_actors(config, f"{key}-{secrets.token_hex(2)}", count)
    coordinator = Coordinator.options(**coordinator_options(config, own[0], pooled=False)).remote()
    return RunActors(coordinator, clients, own, key)


def borrowed_actors(config: RunConfig, run_id: str, count: int, keeper: Any) -> RunActors:
    """Idle pooled actors of the run's kinds, new pooled ones where the pool is short; those a
    dead run left behind are reset first (its coordinator was told to stop: its reset waits for
    that, before the clients are reset behind any task still running on them)."""
    ray_cfg = config.ray
    kind_coordinator, kind_client = kinds(
        ray_cfg.cpus_per_actor, ray_cfg.gpus_per_actor, ray_cfg.coordinator_node, ray_cfg.coordinator_restarts
    )
    lease = secrets.token_hex(8)
    who, wants = pool.borrower(), {kind_coordinator: 1, kind_client: count}
    key, taken = pool.ask(lambda k: k.take.remote(lease, who, run_id, ray_cfg.pool_idle_s, wants), keeper)
    try:
        return completed(config, taken, count, keeper, lease, key, (kind_coordinator, kind_client))
    except BaseException:  # the lease ends with the error: its actors leave (never handed back half reset)
        keeper.give_back.remote(lease, [])
        raise


def completed(
    config: RunConfig, taken: list[Lent], count: int, keeper: Any, lease: str, key: str, kinds: tuple[str, str]
) -> RunActors:
    """The crew from the pool's actors `taken`, and new ones for what they lack (joined to the lease)."""
    kind_coordinator, kind_client = kinds
    coordinator = [lent for lent in taken if lent.kind == kind_coordinator]
    clients = [lent for lent in taken if lent.kind == kind_client]
    if coordinator and coordinator[0].dirty:
        ray.get(coordinator[0].handle.reset.remote())
    ray.get([lent.handle.reset.remote() for lent in clients if lent.dirty])
    new: list[Started] = []
    if not coordinator:
        name = pooled_name("coordinator")
        handle = Coordinator.options(**coordinator_options(config, name, pooled=True)).remote()
        coordinator = [Lent(kind_coordinator, name, handle, dirty=False)]
        new.append(Started(kind_coordinator, name, {}))
    fresh = [pooled_name("client") for _ in range(count - len(clients))]
    for name, handle in zip(fresh, create_client_actors(config, fresh, pooled=True)):
        clients.append(Lent(kind_client, name, handle, dirty=False))
        new.append(Started(kind_client, name, config.resources.each))
    if new:
        pool.ask(lambda k: k.join.remote(lease, new), keeper)
    crew = [*coordinator, *clients]
    return RunActors(coordinator[0].handle, [lent.handle for lent in clients], [lent.name for lent in crew], key, lease)


def release(crew: RunActors, timeout_s: float) -> None:
    """The run ended (however it ended): its own actors are killed; borrowed ones are reset (the
    coordinator first: its run, if still going, stops) and handed back, those that did not reset
    within `timeout_s` sent away."""
    actors = [crew.coordinator, *crew.clients]
    if crew.lease is None:
        for actor in actors:
            ray.kill(actor)
        return
    clean: list[str] = []
    try:
        ray.get(crew.coordinator.reset.remote(), timeout=timeout_s)
        clean.append(crew.names[0])
        resets = {a.reset.remote(): name for a, name in zip(crew.clients, crew.names[1:])}
        done, _ = ray.wait(list(resets), num_returns=len(resets), timeout=timeout_s)
        for ref in done:
            try:
                ray.get(ref)
                clean.append(resets[ref])
            except ray.exceptions.RayError:
                pass
    except ray.exceptions.RayError:
        pass
    finally:
        if not pool.ask(lambda k: k.give_back.remote(crew.lease, clean)):
            for actor in actors:
                ray.kill(actor, no_restart=True)


def create_client_actors(config: RunConfig, names: list[str], pooled: bool) -> list[ray.actor.ActorHandle]:
    """Client actors under `names`, restartable (a killed actor comes back and the executor
    retries its task); `pooled` ones detached and placed outside any placement group (a Tune
    trial's), to outlive the run (the warm pool). Each reads the federation (dataset, partition,
    client procedure) from the object store with its run's first task: no constructor argument
    lives in the object store, which Ray cannot guarantee across restarts (ray-project/ray#53727)."""
    ray_cfg = config.ray
    options: dict[str, Any] = dict(
        num_cpus=ray_cfg.cpus_per_actor,
        num_gpus=ray_cfg.gpus_per_actor,
        max_restarts=-1,
        max_task_retries=0,
        namespace=NAMESPACE,
    )
    if pooled:
        options.update(lifetime="detached", scheduling_strategy="DEFAULT")
    threads = config.resources.torch_threads
    return [ClientActor.options(name=name, **options).remote(threads, ray_cfg.gpus_per_actor) for name in names]


def coordinator_options(config: RunConfig, name: str, pooled: bool) -> dict[str, Any]:
    """Where the coordinator runs (`ray.coordinator_node`: the head node by default, where losing
    it is least likely) and how often Ray restarts it (`ray.coordinator_restarts`). A run's own
    coordinator inside a placement group (a Tune trial's) is placed by the group: its bundles
    hold no node resource; a pooled one is detached and placed outside any group."""
    node = config.ray.coordinator_node
    placed_by_group = not pooled and ray.util.get_current_placement_group() is not None
    resources = {} if node == "any" or placed_by_group else {HEAD_RESOURCE if node == "head" else node: 0.001}
    where = dict(lifetime="detached", scheduling_strategy="DEFAULT") if pooled else {}
    return dict(
        name=name,
        namespace=NAMESPACE,
        num_cpus=0,
        resources=resources,
        max_restarts=config.ray.coordinator_restarts,
        max_task_retries=0,
        **where,
    )


def wait_for_actors(
    actors: Sequence[ray.actor.ActorHandle],
    timeout_s: float,
    report: Callable[[str], None],
    every_s: float = 5.0,
    federation: FederationRef | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Block until every client actor is up (and, given the federation, warmed: `ClientActor.warm`),
    reporting what is still pending every `every_s` seconds (actors that fit the cluster may wait
    for free resources or new nodes); `RuntimeError` after `timeout_s` (`ray.actor_timeout_s`). An
    actor that dies meanwhile is asked again once Ray restarted it; one whose constructor failed
    raises here; `Cancelled` within half a second of `stop`."""
    call = (lambda a: a.info.remote()) if federation is None else (lambda a: a.warm.remote(federation))
    owner = {call(a): a for a in actors}
    started = reported = time.monotonic()
    while True:
        ready, _ = ray.wait(list(owner), num_returns=len(owner), timeout=every_s if stop is None else 0.5)
        if stop is not None and stop.is_set():
            raise Cancelled()
        for ref in ready:
            actor = owner.pop(ref)
            try:
                ray.get(ref)
            except ActorUnavailableError:  # killed while it warmed up, or restarting: ask it again
                owner[call(actor)] = actor
            except RayActorError as exc:  # dead for good (its constructor failed, or no restarts left)
                raise RuntimeError(
                    f"client actor {actors.index(actor)} died while starting ({type(exc).__name__})"
                ) from None
        if not owner:
            return
        waited = time.monotonic() - started
        available = ray.available_resources()
        free = {k: round(available.get(k, 0.0), 3) for k in ("CPU", "GPU") if k in ray.cluster_resources()}
        if waited >= timeout_s:
            raise RuntimeError(
                f"{len(owner)} of {len(actors)} client actors did not start within ray.actor_timeout_s = "
                f"{timeout_s:g} s (free now: {free})"
            )
        if time.monotonic() - reported >= every_s:
            reported = time.monotonic()
            unplaced = sum(
                raystate.placed(a) is False for a in owner.values()
            )  # the others are placed (starting or warming up) or unknown: a busy GCS is no news
            if unplaced:
                report(
                    f"waiting {waited:.0f} s for {unplaced} of {len(actors)} client actors to be placed (free now: "
                    f"{free}; timeout ray.actor_timeout_s = {timeout_s:g} s)"
                )

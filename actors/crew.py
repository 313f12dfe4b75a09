"""A run's actors: its coordinator host and client actors, borrowed from the cluster's warm pool
(`actors.warm`) or started for the run alone, and given back (or killed) when it ends."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import ray

from actors import warm
from actors.client import create_client_actors
from actors.coordinator import Coordinator, coordinator_options
from actors.pool import check_fits, pool_size
from rayfl.config import ConfigError, RunConfig


@dataclass
class Crew:
    """The coordinator (first in `names`) and the client actors of one run; `lease` names its
    booking in the pool, None for actors of this run alone."""

    coordinator: Any
    clients: list
    names: list[str]
    key: str
    lease: str | None = None


def gather(config: RunConfig, run_id: str, pooled: bool) -> Crew:
    """The run's actors: `ray.num_actors` client actors (under `auto`, as many as the free
    resources and the pool's idle actors hold; `ConfigError` when the asked number can never fit
    the cluster, or `ray.coordinator_node` names a resource no node has) and a coordinator host.
    `pooled`: the pool's idle actors of the run's kinds first, new pooled ones for the rest;
    else new ones named after the run (a suffix when a live run has that name: RUN_DIRs a/run
    and b/run)."""
    room = dict(ray.available_resources())
    keeper = warm.keeper() if pooled else None
    if keeper is not None:
        for key, value in ray.get(keeper.idle_resources.remote()).items():
            room[key] = room.get(key, 0.0) + value
    count = pool_size(config, room)
    check_fits(config, count, ray.cluster_resources(), ray._private.state.state.get_max_resources_from_cluster_config())
    node = config.ray.coordinator_node
    if node not in ("head", "any") and node not in ray.cluster_resources():
        raise ConfigError(f"ray.coordinator_node: no node of the cluster has a resource {node!r}")
    if keeper is None:
        return own_crew(config, run_id, count)
    return borrowed_crew(config, run_id, count, keeper)


def own_crew(config: RunConfig, key: str, count: int) -> Crew:
    names = [warm.actor_name(key, "coordinator"), *(warm.actor_name(key, f"client-{k}") for k in range(count))]
    try:
        clients = create_client_actors(config, names[1:], pooled=False)
    except ray.exceptions.ActorAlreadyExistsError:  # a run of that name is live on the cluster
        return own_crew(config, f"{key}-{secrets.token_hex(2)}", count)
    coordinator = Coordinator.options(**coordinator_options(config, names[0], pooled=False)).remote()
    return Crew(coordinator, clients, names, key)


def borrowed_crew(config: RunConfig, run_id: str, count: int, keeper: Any) -> Crew:
    """Idle pooled actors of the run's kinds, new pooled ones where the pool is short; those a
    dead run left behind are reset first (its coordinator was told to stop: its reset waits for
    that, before the clients are reset behind any task still running on them)."""
    ray_cfg = config.ray
    kind_coordinator, kind_client = warm.kinds(
        ray_cfg.cpus_per_actor, ray_cfg.gpus_per_actor, ray_cfg.coordinator_node, ray_cfg.coordinator_restarts
    )
    lease = secrets.token_hex(8)
    key, taken = ray.get(
        keeper.take.remote(
            lease, warm.borrower(), run_id, ray_cfg.pool_idle_s, {kind_coordinator: 1, kind_client: count}
        )
    )
    try:
        return completed(config, taken, count, keeper, lease, key, (kind_coordinator, kind_client))
    except BaseException:  # the lease ends with the error: its actors leave (never handed back half reset)
        keeper.give_back.remote(lease, [])
        raise


def completed(
    config: RunConfig, taken: list, count: int, keeper: Any, lease: str, key: str, kinds: tuple[str, str]
) -> Crew:
    """The crew from the pool's actors `taken`, and new ones for what they lack (joined to the lease)."""
    kind_coordinator, kind_client = kinds
    coordinator = [(name, handle, dirty) for kind, name, handle, dirty in taken if kind == kind_coordinator]
    clients = [(name, handle, dirty) for kind, name, handle, dirty in taken if kind == kind_client]
    if coordinator and coordinator[0][2]:
        ray.get(coordinator[0][1].reset.remote())
    ray.get([handle.reset.remote() for _, handle, was in clients if was])
    new = []
    if not coordinator:
        name = warm.pooled_name("coordinator")
        coordinator = [(name, Coordinator.options(**coordinator_options(config, name, pooled=True)).remote(), False)]
        new.append((kind_coordinator, name, coordinator[0][1], {}))
    names = [warm.pooled_name("client") for _ in range(count - len(clients))]
    per_actor = {"CPU": config.ray.cpus_per_actor, "GPU": config.ray.gpus_per_actor}
    for name, handle in zip(names, create_client_actors(config, names, pooled=True)):
        clients.append((name, handle, False))
        new.append((kind_client, name, handle, per_actor))
    if new:
        ray.get(keeper.join.remote(lease, new))
    crew = [*coordinator, *clients]
    return Crew(coordinator[0][1], [h for _, h, _ in clients], [n for n, _, _ in crew], key, lease)


def release(crew: Crew, timeout_s: float) -> None:
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
        if not ray.get(warm.keeper().give_back.remote(crew.lease, clean)):
            for actor in actors:
                ray.kill(actor, no_restart=True)

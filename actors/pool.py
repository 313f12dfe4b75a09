"""Pool sizing and the Ray executor: any idle client actor takes the next task.

The executor puts each distinct weights dict in the object store once per round and passes
the reference, so every actor reads the same arrays zero-copy. A task whose actor dies is
retried on another actor (a restarted actor rejoins the pool; one that fails `max_attempts`
calls in a row leaves it); after `max_attempts` tries the client is recorded as failed for
the round.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import Mapping, Sequence

import numpy as np
import ray
import torch
from ray.exceptions import RayActorError, RayTaskError

from rayfl.algorithms.base import ClientFailure, ClientResult, ClientTask
from rayfl.config import ConfigError, RunConfig
from rayfl.algorithms.split import SplitTask, TopServer


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


class RayExecutor:
    """Dispatches a round's tasks over client actors, first idle actor first."""

    def __init__(self, actors: Sequence[ray.actor.ActorHandle], max_attempts: int = 3):
        self.actors = list(actors)
        self.max_attempts = max_attempts

    def run(self, tasks: Sequence[ClientTask]) -> list[ClientResult | ClientFailure]:
        refs: dict[int, ray.ObjectRef] = {}
        pending = deque(tasks)
        idle = deque(self.actors)
        attempts: dict[int, int] = {}
        strikes: dict[int, int] = {}  # consecutive failed calls per actor
        inflight: dict[ray.ObjectRef, tuple[ray.actor.ActorHandle, ClientTask]] = {}
        out: list[ClientResult | ClientFailure] = []
        while pending or inflight:
            while pending and idle:
                task = pending.popleft()
                actor = idle.popleft()
                key = id(task.weights)
                if key not in refs:
                    refs[key] = ray.put(dict(task.weights))
                light = dataclasses.replace(task, weights={})
                call = actor.run.options(name=f"round{task.round}/client{task.client_id}")
                inflight[call.remote(light, refs[key])] = (actor, task)
            if not inflight:  # every actor is gone
                out += [ClientFailure(t.client_id, t.round, "no client actor left") for t in pending]
                break
            ready, _ = ray.wait(list(inflight), num_returns=1)
            actor, task = inflight.pop(ready[0])
            try:
                out.append(ray.get(ready[0]))
                strikes[id(actor)] = 0
                idle.append(actor)
            except RayActorError:
                strikes[id(actor)] = strikes.get(id(actor), 0) + 1
                if strikes[id(actor)] < self.max_attempts:
                    idle.append(actor)
                else:
                    self.actors.remove(actor)
                attempts[task.client_id] = attempts.get(task.client_id, 0) + 1
                if attempts[task.client_id] < self.max_attempts:
                    pending.append(task)
                else:
                    out.append(ClientFailure(task.client_id, task.round, f"actor died {self.max_attempts} times"))
            except RayTaskError as exc:
                idle.append(actor)
                out.append(ClientFailure(task.client_id, task.round, f"{type(exc.cause).__name__}: {exc.cause}"))
        return out

    def run_split(self, tasks: Sequence[SplitTask], server: TopServer) -> list[ClientResult | ClientFailure]:
        """Split learning with every worker pinned to one actor for the round (round-robin in task
        order): per iteration all bottom forwards run in parallel across actors, the server steps,
        and the gradients go back; an actor runs its calls in order, so the next forward waits for
        the backward. A dying actor fails the round's split exchange (no retry mid-round)."""
        if not tasks:
            return []
        home = {t.client_id: self.actors[i % len(self.actors)] for i, t in enumerate(tasks)}
        refs: dict[int, ray.ObjectRef] = {}
        opened = []
        for t in tasks:
            key = id(t.weights)
            if key not in refs:
                refs[key] = ray.put(dict(t.weights))
            opened.append(home[t.client_id].split_open.remote(dataclasses.replace(t, weights={}), refs[key]))
        pending = opened
        for _ in range(tasks[0].tau):
            forwards = [home[t.client_id].split_forward.remote(t.client_id) for t in tasks]
            ray.get(pending)  # surfaces a failed backward; the forwards already queue behind them
            outs = ray.get(forwards)
            features = [torch.from_numpy(np.array(f)) for f, _ in outs]
            labels = [torch.from_numpy(np.array(y)) for _, y in outs]
            losses, grads = server.step(features, labels)
            pending = [home[t.client_id].split_backward.remote(t.client_id, g.numpy(), loss) for t, g, loss in zip(tasks, grads, losses)]
        ray.get(pending)
        return ray.get([home[t.client_id].split_close.remote(t.client_id) for t in tasks])


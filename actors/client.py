"""Client actors: thin Ray hosts of the core's `ClientRunner` (they hold no formula).

An actor is an executor with a fractional resource share; it takes any logical client's
task, since a client's persistent state travels with its task. It reads the training
arrays zero-copy from the object store, pins torch's threads to its CPU share, and on a GPU
slice trains on CUDA with its memory capped to its fraction.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import random
import time
from typing import Any

import numpy as np
import ray
import torch

from actors.warm import NAMESPACE
from rayfl.algorithms.exchange import invoke
from rayfl.algorithms.messages import ClientResult, ClientTask
from rayfl.config import RunConfig
from rayfl.types import Weights


def torch_threads_for(cpus: float) -> int:
    """Threads for a CPU share: floor(cpus), at least 1 (Ray's own OMP_NUM_THREADS rule)."""
    return max(1, math.floor(cpus))


def rng_states(device: str) -> tuple:
    """The global RNGs' states (Python's, numpy's, torch's, and CUDA's on `device` cuda)."""
    return (
        random.getstate(),
        np.random.get_state(),
        torch.get_rng_state(),
        torch.cuda.get_rng_state_all() if device == "cuda" else None,
    )


def restore_rng_states(states: tuple) -> None:
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])
    if states[3] is not None:
        torch.cuda.set_rng_state_all(states[3])


@ray.remote
class ClientActor:
    """Runs client tasks for one federation at a time (the one whose reference its task carries);
    created with explicit `num_cpus` / `num_gpus`. A pooled actor serves one run after another,
    `reset` between them."""

    def __init__(self, threads: int, gpu_fraction: float):
        torch.set_num_threads(threads)
        device, self.memory_share = "cpu", None
        if gpu_fraction > 0 and torch.cuda.is_available():
            device = "cuda"
            torch.cuda.set_per_process_memory_fraction(min(1.0, gpu_fraction))
            self.memory_share = min(1.0, gpu_fraction) * torch.cuda.get_device_properties(0).total_memory
        self.device = device
        self.born = rng_states(device)
        self.reset()

    def reset(self) -> bool:
        """Forget the run it served: its federation, runner, open sessions, and whatever its
        code drew from the global RNGs (set back to a new process's), as if just started."""
        self.hosted: str | None = None  # the federation's reference (hex) the runner serves
        self.runner: Any = None
        self.account: Any = None  # the federation's ClientAccount: what a client computes for the server
        self.model: Any = None  # the global model's variant (what `warm` takes through a first step)
        self.sessions: dict[int, Any] = {}
        restore_rng_states(self.born)
        gc.collect()
        gc.freeze()  # what outlives a run (modules, caches) is not scanned again: the next reset takes milliseconds
        return True

    def hosting(self, federation_box: list) -> Any:
        """The `ClientRunner` of the federation in the box (read from the object store on the
        run's first task, and again by an actor that restarted; a task of another run, queued
        behind a reset, hosts its own)."""
        if self.hosted != federation_box[0].hex():
            from rayfl.engine import ClientRunner

            fed = ray.get(federation_box[0])
            self.runner = ClientRunner.of(fed, self.device, self.memory_share)
            self.account, self.model, self.hosted = fed.account, fed.policy.global_model(), federation_box[0].hex()
        return self.runner

    def warm(self, federation_box: list) -> dict[str, Any]:
        """Ready for the first round: the federation read and a throwaway copy of the global
        model taken once through a forward, backward and optimizer step (torch's lazy first-call
        set-up, its optimizers' import of torch._dynamo included). Returns `info()`."""
        runner = self.hosting(federation_box)
        model = runner.context.build(self.model).train()
        model(torch.zeros(2, *runner.clients.input_shape, device=self.device)).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.0).step()
        return self.info()

    def run_group(self, federation_box: list, tasks: list[ClientTask], weight_refs: list, sums: bool) -> Any:
        """Train a group of tasks (the core's `run_group`, summed here with `sums`); the round's
        weights arrive as object references, one per task (the same few shared by all), read zero-copy."""
        from rayfl.engine import run_group

        runner = self.hosting(federation_box)
        weights = ray.get(weight_refs)
        tasks = [dataclasses.replace(t, weights=w) for t, w in zip(tasks, weights)]
        return run_group(runner, self.account, tasks, sums)

    def hold(self, seconds: float) -> None:
        """Stay busy (`clock: emulate`): a client's task lasts its scaled virtual time."""
        time.sleep(seconds)

    # A server-in-the-loop round: a client's session stays on this actor for the round.

    def open_session(self, federation_box: list, task: ClientTask, weights: Weights) -> None:
        self.sessions[task.client_id] = self.hosting(federation_box).open_session(
            dataclasses.replace(task, weights=weights)
        )

    def session_calls(self, method: str, calls: list[tuple[int, tuple]]) -> list[Any]:
        """`method` on this actor's sessions, in the order given: (client id, arguments) each."""
        return [invoke(self.sessions[client], method, args) for client, args in calls]

    def close_session(self, client_id: int) -> ClientResult:
        return self.sessions.pop(client_id).close()

    def ready(self) -> bool:
        """A probe: answers once the actor runs (again, after Ray restarted it)."""
        return True

    def info(self) -> dict[str, Any]:
        import os

        ctx = ray.get_runtime_context()
        return {
            "pid": os.getpid(),
            "hosted": self.hosted,
            "device": self.device,
            "torch_threads": torch.get_num_threads(),
            "gpu_ids": ctx.get_accelerator_ids().get("GPU", []),
            "placement_group": ctx.get_placement_group_id(),
            "cuda_memory_fraction": torch.cuda.get_per_process_memory_fraction(0) if self.device == "cuda" else None,
        }


def create_client_actors(config: RunConfig, names: list[str], pooled: bool) -> list[ray.actor.ActorHandle]:
    """Client actors under `names`, restartable (a killed actor comes back and the executor
    retries its task); `pooled` ones detached and placed outside any placement group (a Tune
    trial's), to outlive the run (`actors.warm`). Each reads the federation (dataset, partition,
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
    threads = torch_threads_for(ray_cfg.cpus_per_actor)
    return [ClientActor.options(name=name, **options).remote(threads, ray_cfg.gpus_per_actor) for name in names]

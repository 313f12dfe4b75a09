"""Client actors: thin Ray hosts of the core's `ClientRunner` (they hold no formula).

An actor is an executor with a fractional resource share; it takes any logical client's
task, since a client's persistent state travels with its task. It reads the training
arrays zero-copy from the object store, pins torch's threads to its CPU share, and on a GPU
slice trains on CUDA with its memory capped to its fraction.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any

import ray
import torch

from rayfl import rng
from rayfl.algorithms.exchange import invoke
from rayfl.algorithms.messages import ClientResult, ClientTask
from rayfl.types import Weights

from .names import FederationRef


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
        self.born = rng.global_states(cuda=device == "cuda")
        self.reset()

    def reset(self) -> bool:
        """Forget the run it served: its federation, runner, open sessions, and whatever its
        code drew from the global RNGs (set back to a new process's), as if just started."""
        self.hosted: str | None = None  # the federation's reference (hex) the runner serves
        self.runner: Any = None
        self.account: Any = None  # the federation's ClientAccount: what a client computes for the server
        self.model: Any = None  # the global model's variant (what `warm` takes through a first step)
        self.sessions: dict[int, Any] = {}
        rng.restore_global_states(self.born)
        gc.collect()
        gc.freeze()  # what outlives a run (modules, caches) is not scanned again: the next reset takes milliseconds
        return True

    def hosting(self, federation: FederationRef) -> Any:
        """The `ClientRunner` of the run's `federation` (read from the object store on the run's
        first task, and again by an actor that restarted; a task of another run, queued behind a
        reset, hosts its own)."""
        if self.hosted != federation.key():
            from rayfl.engine import ClientRunner

            fed = ray.get(federation.ref)
            self.runner = ClientRunner.of(fed, self.device, self.memory_share)
            self.account, self.model, self.hosted = fed.account, fed.policy.global_model(), federation.key()
        return self.runner

    def warm(self, federation: FederationRef) -> dict[str, Any]:
        """Ready for the first round: the federation read and a throwaway copy of the global
        model taken once through a forward, backward and optimizer step (torch's lazy first-call
        set-up, its optimizers' import of torch._dynamo included). Returns `info()`."""
        runner = self.hosting(federation)
        model = runner.context.models.build(self.model).train()
        model(torch.zeros(2, *runner.clients.input_shape, device=self.device)).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.0).step()
        return self.info()

    def run_group(self, federation: FederationRef, tasks: list[ClientTask], weight_refs: list, *, sums: bool) -> Any:
        """Train a group of tasks (the core's `run_group`, summed here with `sums`); the round's
        weights arrive as object references, one per task (the same few shared by all), read zero-copy."""
        from rayfl.engine import run_group

        runner = self.hosting(federation)
        distinct = list(dict.fromkeys(weight_refs))  # one dict per distinct weights: it crosses to the device once
        weights = dict(zip(distinct, ray.get(distinct)))
        tasks = [dataclasses.replace(t, weights=weights[r]) for t, r in zip(tasks, weight_refs)]
        return run_group(runner, self.account, tasks, sums)

    def hold(self, seconds: float) -> None:
        """Stay busy (`clock: emulate`): a client's task lasts its scaled virtual time."""
        time.sleep(seconds)

    # A server-in-the-loop round: a client's session stays on this actor for the round.

    def open_session(self, federation: FederationRef, task: ClientTask, weights: Weights) -> None:
        self.sessions[task.client_id] = self.hosting(federation).open_session(
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

"""The entry point that puts a federation on Ray: `rayfl.api.run(config)`.

This module, `rayfl.jobs` (Ray jobs) and `rayfl.cli` are the only parts of `rayfl` that touch
Ray, and they import Ray lazily, inside the functions.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from . import checkpoint
from .config import RunConfig
from .engine import Progress, Start, new_run_dir, prepare

log = logging.getLogger("rayfl")


def connect(address: str | None, dashboard: bool, verbose: bool = False) -> bool:
    """Join `address` (or $RAY_ADDRESS), else start a local cluster sized to the machine, with the
    dashboard on 127.0.0.1 if asked; Ray's log lines and the workers' output only when `verbose`.
    Returns whether this call connected (and should disconnect)."""
    import ray

    if ray.is_initialized():
        return False
    quiet = dict(logging_level=logging.INFO if verbose else logging.ERROR, log_to_driver=verbose)  # rayfl speaks in its own lines
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, **quiet)
    else:
        ray.init(address="local", include_dashboard=dashboard, dashboard_host="127.0.0.1", **quiet)
    return True


def run(
    config: RunConfig,
    run_dir: str | Path | None = None,
    address: str | None = None,
    progress: Progress | None = None,
    resume: bool = False,
    run_id: str | None = None,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Run one federation on Ray: a coordinator actor and client actors; returns the summary.
    With `resume`, continue RUN_DIR from its newest checkpoint. Actors are named after `run_id`
    (default: RUN_DIR's name). `timings`, when given, receives the seconds of each phase:
    `build`, `ray_start`, `actors` (started and warmed), `rounds`, `shutdown`.

    Everything that can be wrong with the input (dataset, partition, model, device profile) is
    checked before Ray starts: the federation is built here, once, and enters the object store
    once (dataset included), where the coordinator and the client actors read it.
    """
    phase = Phases(timings)
    run_dir = Path(run_dir or new_run_dir(config))
    fed, start = prepare(config, run_dir, resume)  # the whole input checked; the federation built once
    phase("build")
    run_dir = run_dir.resolve()  # where the coordinator writes, whatever its working directory
    run_id = run_id or run_dir.name

    import ray
    from ray.exceptions import RayActorError, RayTaskError

    from actors.coordinator import start_federation
    from actors.pool import check_fits, wait_for_actors

    address = address or config.ray.address
    if not (ray.is_initialized() or address or os.environ.get("RAY_ADDRESS")) and config.ray.num_actors != "auto":
        # A local cluster gets at most this machine's CPUs: refuse before starting it.
        check_fits(config, config.ray.num_actors, {"CPU": os.cpu_count() or 1, "GPU": math.inf}, None)
    connected = connect(address, config.ray.dashboard)
    phase("ray_start")
    actors: list = []
    try:
        coordinator, clients, fed_ref = start_federation(fed, str(run_dir), run_id)
        actors = [coordinator, *clients]
        coordinator_ready = coordinator.warm.remote()
        wait_for_actors(clients, config.ray.actor_timeout_s, log.info, federation_ref=fed_ref)
        ray.get(coordinator_ready)
        phase("actors")
        summary = follow(coordinator, start, progress)
        phase("rounds")
        return summary
    except RayTaskError as exc:  # the round loop raised inside the coordinator: its own error, one line
        raise RunFailed(f"{type(exc.cause).__name__}: {str(exc.cause).splitlines()[0]}; {resume_hint(run_dir)}") from exc
    except RayActorError as exc:
        raise RunFailed(f"the coordinator actor died ({type(exc).__name__}); {resume_hint(run_dir)}") from exc
    finally:
        for actor in actors:
            ray.kill(actor)
        if connected:
            ray.shutdown()
        phase("shutdown")


def follow(coordinator: Any, start: Start, progress: Progress | None) -> dict[str, Any]:
    """The coordinator's rounds from `start`, its finished rows relayed to `progress` every 0.5 s
    while they run; returns the run's summary."""
    import ray

    done = coordinator.run.remote(start)
    finished = False
    while not finished:
        finished = bool(ray.wait([done], timeout=0.5)[0])
        for row in ray.get(coordinator.progress.remote()):
            if progress is not None:
                progress(row)
    return ray.get(done)


class Phases:
    """Seconds since the previous mark, recorded under each mark's name (when a dict is given)."""

    def __init__(self, out: dict[str, float] | None):
        self.out, self.last = out, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        if self.out is not None:
            self.out[name] = now - self.last
        self.last = now


class RunFailed(RuntimeError):
    """A run that broke off on Ray; its message is one line and says how to continue it."""


def resume_hint(run_dir: Path) -> str:
    if checkpoint.exists(run_dir):
        return f"continue it with: rayfl run --resume {run_dir}"
    return "no checkpoint was written yet; start it again"

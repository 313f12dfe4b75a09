"""Entry points that put federations on Ray: `rayfl.api.run(config)` and job submission.

This module (with `rayfl.cli`) is the only part of `rayfl` that touches Ray, and it imports
Ray lazily, inside the functions.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import time
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

import yaml

from . import checkpoint
from .config import ConfigError, RunConfig, to_dict
from .engine import Progress, Start, new_run_dir, prepare

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parent.parent
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


def auth_headers() -> dict[str, str]:
    """The bearer token the way Ray's clients find it: $RAY_AUTH_TOKEN, the file at
    $RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token. Empty when there is none (auth off)."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()
        if path.is_file():
            token = path.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def submit(config: RunConfig, address: str, out: str | None = None, metadata: Mapping[str, str] | None = None) -> str:
    """Submit one federation as a Ray job with this repository as its working dir; returns the job id.

    The resolved config travels inside the entrypoint, so the job runs exactly what was validated here.
    """
    from ray.job_submission import JobSubmissionClient

    entry = ["python", "-m", "rayfl", "run", "--config-yaml", yaml.safe_dump(to_dict(config), sort_keys=False)]
    if out:
        entry += ["--out", out]
    client = retried(lambda: JobSubmissionClient(address, headers=auth_headers()), "connecting to the cluster")
    return retried(
        lambda: client.submit_job(
            entrypoint=shlex.join(entry),
            runtime_env={"working_dir": str(REPO_ROOT), "excludes": ["runs/", ".git/", "**/__pycache__/", "*.egg-info/"]},
            metadata=dict(metadata or {}),
        ),
        "submitting the job",
    )


TRANSIENT = ("No available agent", "status code 502", "status code 503", "status code 504", "Failed to connect", "Connection refused")
"""What a dashboard says while its head node is still coming up (its job agent not registered yet)."""


def retried(call: Callable[[], T], what: str, budget_s: float = 60.0) -> T:
    """`call()`, retried with doubling waits (0.5 s up to 8 s) while it fails transiently, for at
    most `budget_s` seconds; a lasting or other error is raised as it is."""
    delay, started = 0.5, time.monotonic()
    while True:
        try:
            return call()
        except (RuntimeError, ConnectionError) as exc:
            message = str(exc)
            if not any(t in message for t in TRANSIENT) or time.monotonic() - started + delay > budget_s:
                raise
            log.info(f"{what}: {message.splitlines()[0]} (retrying in {delay:g} s)")
            time.sleep(delay)
            delay = min(2 * delay, 8.0)


def wait(address: str, job_id: str) -> int:
    """Stream a job's logs until it ends; 0 if it succeeded, 1 otherwise."""
    import asyncio

    from ray.job_submission import JobStatus, JobSubmissionClient

    client = retried(lambda: JobSubmissionClient(address, headers=auth_headers()), "connecting to the cluster")

    async def tail() -> None:
        async for lines in client.tail_job_logs(job_id):
            print(lines, end="", flush=True)

    asyncio.run(tail())
    status = client.get_job_status(job_id)
    return 0 if status == JobStatus.SUCCEEDED else 1


def validate_address(address: str) -> str:
    if not address.startswith(("http://", "https://")):
        raise ConfigError(f"--address: {address!r} is not a dashboard URL (http://HOST:8265)")
    return address

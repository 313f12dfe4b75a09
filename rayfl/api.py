"""Entry points that put federations on Ray: `rayfl.api.run(config)` and job submission.

This module (with `rayfl.cli`) is the only part of `rayfl` that touches Ray, and it imports
Ray lazily, inside the functions.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any, Mapping

import yaml

from .config import ConfigError, RunConfig, to_dict
from .engine import build_federation
from .runner import Progress, new_run_dir

REPO_ROOT = Path(__file__).resolve().parent.parent


def connect(address: str | None, dashboard: bool) -> bool:
    """Join `address` (or $RAY_ADDRESS), else start a local cluster sized to the machine, with the
    dashboard on 127.0.0.1 if asked. Returns whether this call connected (and should disconnect)."""
    import ray

    if ray.is_initialized():
        return False
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address)
    else:
        ray.init(address="local", include_dashboard=dashboard, dashboard_host="127.0.0.1", log_to_driver=False)
    return True


def run(
    config: RunConfig,
    run_dir: str | Path | None = None,
    address: str | None = None,
    progress: Progress | None = None,
    resume: bool = False,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Run one federation on Ray: a coordinator actor and client actors; returns the summary.
    With `resume`, continue RUN_DIR from its newest checkpoint. Actors are named after `run_id`
    (default: RUN_DIR's name).

    Everything that can be wrong with the input (dataset, partition, model, device profile) is
    checked before Ray starts: the federation is built here, once, and enters the object store
    once (dataset included), where the coordinator and the client actors read it.
    """
    fed = build_federation(config)  # validates data, partition, profile and model; built once, shipped
    run_dir = Path(run_dir or new_run_dir(config)).resolve()
    run_id = run_id or run_dir.name

    import ray

    from actors.coordinator import start_federation

    connected = connect(address or config.ray.address, config.ray.dashboard)
    coordinator = None
    try:
        coordinator = start_federation(fed, str(run_dir), run_id)
        ray.get(coordinator.ready.remote())
        done = coordinator.run.remote(resume)
        finished = False
        while not finished:
            finished = bool(ray.wait([done], timeout=0.5)[0])
            for row in ray.get(coordinator.progress.remote()):
                if progress is not None:
                    progress(row)
        return ray.get(done)
    finally:
        if coordinator is not None:
            ray.get(coordinator.shutdown.remote())
            ray.kill(coordinator)
        if connected:
            ray.shutdown()


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
    client = JobSubmissionClient(address, headers=auth_headers())
    return client.submit_job(
        entrypoint=shlex.join(entry),
        runtime_env={"working_dir": str(REPO_ROOT), "excludes": ["runs/", ".git/", "**/__pycache__/", "*.egg-info/"]},
        metadata=dict(metadata or {}),
    )


def wait(address: str, job_id: str) -> int:
    """Stream a job's logs until it ends; 0 if it succeeded, 1 otherwise."""
    import asyncio

    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address, headers=auth_headers())

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

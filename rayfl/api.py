"""The entry points that put federations on Ray: `rayfl.api.run(config)`, and runs as Ray jobs
(`rayfl submit`, named after the run with a quiet `--wait`, and `rayfl fetch`).

This module and `rayfl.cli` are the only parts of `rayfl` that touch Ray, and they import Ray
lazily, inside the functions.

A submitted run is a job whose submission id names it (`rayfl-<algorithm>-<dataset>-<time>`)
and whose metadata carries the algorithm, dataset and run id, so the dashboard's Jobs page
tells runs apart. Its resolved config travels in the job's environment (`RAYFL_CONFIG`), not
its command line. Where its RUN_DIR lands: `rayfl.storage`. `rayfl fetch JOB_ID` reads the
RUN_DIR the job printed (`rayfl: RUN_DIR <location>`) from its logs and copies it here: from a
URI through `pyarrow.fs`, from a folder this machine can read directly, else through a Ray task
on the job's node (Ray Client, `ray://HOST:10001`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import secrets
import shlex
import tarfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import urlparse

import yaml

from . import checkpoint, storage
from .config import ConfigError, RunConfig, shown, to_dict
from .config.files import PATHS
from .engine import Progress, new_run_dir, prepare
from .upload import upload_excludes

log = logging.getLogger("rayfl")


def run(
    config: RunConfig,
    run_dir: str | Path | None = None,
    address: str | None = None,
    progress: Progress | None = None,
    resume: bool = False,
    run_id: str | None = None,
    timings: dict[str, float] | None = None,
    hand_over: Any = None,
) -> dict[str, Any]:
    """Run one federation on Ray: a coordinator actor and client actors (on a running cluster
    borrowed warm from its pool, `actors/keeper.py`; `run_id`, default RUN_DIR's name, names the
    run; `actors/driver/launch.py`); returns the summary. With `resume`, continue RUN_DIR from its
    newest checkpoint. `timings`, when given, receives the seconds of each phase: `build`, `ray_start`,
    `actors` (started or borrowed, and warmed), `rounds`, `shutdown`; a run begun in this process while
    the actors came up (`ray.start_in_process`) has `in_process` (its rounds here) instead of
    `ray_start`; `hand_over` (an `actors.driver.handover.Rule`) says when such a run moves onto its
    actors (default: after the first round that ends once they answer, and on a local cluster of
    the run's own only when they finish the rounds left sooner). The whole input is checked before
    Ray starts: the federation is built here, once, and enters the object store once."""
    phase = Phases(timings)
    run_dir = Path(run_dir or new_run_dir(config))
    fed, start = prepare(config, run_dir, resume)  # the whole input checked; the federation built once
    phase("build")
    run_dir = run_dir.resolve()  # where the coordinator writes, whatever its working directory
    run_id = run_id or run_dir.name

    from actors.driver.head import joining, on_the_kept_head

    address = joining(address or config.ray.address)  # before Ray's import: joining a kept head sets its auth mode
    from ray.exceptions import RayActorError, RayTaskError

    from actors.driver.launch import RoundsFailed, launch

    try:
        with on_the_kept_head(address):  # `rayfl down` stops this run first
            return launch(fed, start, run_dir, run_id, address, progress, phase, hand_over)
    except (RayTaskError, RoundsFailed) as exc:  # the round loop raised (in the coordinator, or here): one line
        raise broke_off(exc.cause, run_dir) from exc
    except RayActorError as exc:
        raise RunFailed(f"the coordinator actor died ({type(exc).__name__}); {resume_hint(run_dir)}") from exc
    except RuntimeError as exc:  # the coordinator did not come back, client actors did not start
        raise RunFailed(f"{shown(str(exc))}; {resume_hint(run_dir)}") from exc


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


def broke_off(exc: BaseException, run_dir: Path) -> RunFailed:
    """The one line of a run that `exc` ended (in this process or in the coordinator): the error's
    type and first line (an `OSError` names its path and cause), and how to continue."""
    first = shown((str(exc).splitlines() or [""])[0])  # the cause cut and escaped; the hint whole
    return RunFailed(f"{type(exc).__name__}: {first}; {resume_hint(run_dir)}")


def resume_hint(run_dir: Path) -> str:
    """How to go on with the run in `run_dir`: from its newest checkpoint, or, before the first, by
    starting it again into the same folder (which now holds a run: `--overwrite` replaces it)."""
    if checkpoint.exists(run_dir):
        return f"continue it with: rayfl run --resume {run_dir}"
    return f"no checkpoint was written yet; start it again with --out {run_dir} --overwrite"


T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_DIR_LINE = re.compile(r"^rayfl: RUN_DIR (\S+)\s*$", re.M)
"""The line a run inside a job prints first: where its RUN_DIR is (`fetch` reads it back)."""


def auth_headers() -> dict[str, str]:
    """This process's bearer token for a dashboard (`actors.driver.head.bearer`)."""
    from actors.driver.head import bearer

    return bearer(os.environ)


def job_id(config: RunConfig) -> str:
    """`rayfl-<algorithm>-<dataset>-<YYYYmmdd-HHMMSS>-<4 hex>`: the run's name, unique."""
    return f"rayfl-{config.algorithm.name}-{config.data.name}-{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def portable(config: RunConfig) -> dict[str, Any]:
    """The config as the job reads it: paths inside this repository relative to it (the job's
    working dir is a copy of it), the others as they are."""
    raw = to_dict(config)
    for section, key in PATHS:
        value = raw.get(section, {}).get(key)
        if isinstance(value, str) and Path(value).is_absolute() and Path(value).resolve().is_relative_to(REPO_ROOT):
            raw[section][key] = str(Path(value).resolve().relative_to(REPO_ROOT))
    return raw


def client(address: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    return retried(lambda: JobSubmissionClient(address, headers=auth_headers()), "connecting to the cluster")


def submit(config: RunConfig, address: str, out: str | None = None, verbose: bool = False) -> str:
    """Submit one federation as a Ray job with this repository as its working dir; returns the
    job's submission id, which names the run (and is its RUN_DIR's name by default). Ray's INFO
    and WARNING lines about packaging the working dir only when `verbose`."""
    excludes = upload_excludes(REPO_ROOT)
    jobs = client(address)
    for name in (
        "ray",
        "ray.dashboard.modules.dashboard_sdk",
        "ray.dashboard.modules.job.sdk",
    ):  # the SDK sets INFO when imported
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.ERROR)
    name = job_id(config)
    entry = ["python", "-m", "rayfl", "run", "--config-env", "RAYFL_CONFIG", "--progress", "lines"]
    if out:
        entry += ["--out", out]
    return retried(
        lambda: jobs.submit_job(
            entrypoint=shlex.join(entry),
            submission_id=name,
            runtime_env={
                "working_dir": str(REPO_ROOT),
                "excludes": excludes,
                "env_vars": {"RAYFL_CONFIG": yaml.safe_dump(portable(config), sort_keys=False)},
            },
            metadata={
                "algorithm": config.algorithm.name,
                "dataset": config.data.name,
                "run_id": name,
                "out": out or "",
            },
        ),
        "submitting the job",
    )


TRANSIENT = (
    "No available agent",
    "status code 502",
    "status code 503",
    "status code 504",
    "Failed to connect",
    "Connection refused",
    "Starting Ray client server failed",
)
"""What a dashboard says while its head node is still coming up (its job agent not registered
yet), and what Ray Client says when its per-connection server did not start in time on a busy head."""


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


FAILED_TAIL = 20
"""How many of a failed job's last log lines `wait` shows when it was quiet (its traceback)."""


def wait(address: str, job: str, verbose: bool = False) -> int:
    """Follow a job until it ends; 0 if it succeeded, 1 otherwise. Quiet (`Quiet`) unless
    `verbose`, which streams every log line; a job that did not succeed is followed on stderr by
    its last `FAILED_TAIL` log lines when they were not shown, so that the cause is on screen."""
    import asyncio
    import sys
    from collections import deque

    from ray.job_submission import JobStatus

    jobs = client(address)
    from .console import Quiet

    quiet = Quiet(sys.stdout.write)
    last: deque[str] = deque(maxlen=FAILED_TAIL)

    async def tail() -> None:
        pending = ""
        async for chunk in jobs.tail_job_logs(job):
            if verbose:
                print(chunk, end="", flush=True)
                continue
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                quiet(line)
                last.append(line)
        if pending and not verbose:
            quiet(pending)
            last.append(pending)

    asyncio.run(tail())
    quiet.close()
    status = jobs.get_job_status(job)
    if status != JobStatus.SUCCEEDED:
        print(f"rayfl: job {job} {status.value.lower()}", file=sys.stderr)
        if last:
            print(f"rayfl: its last {len(last)} log lines:", *last, sep="\n", file=sys.stderr)
    return 0 if status == JobStatus.SUCCEEDED else 1


def run_dir_of(address: str, job: str) -> str:
    """The RUN_DIR location a job's run printed."""
    found = RUN_DIR_LINE.search(retried(lambda: client(address).get_job_logs(job), "reading the job's logs"))
    if not found:
        raise ConfigError(f"{job}: its logs name no RUN_DIR (a job not started by rayfl, or not started yet)")
    return found.group(1)


def fetch(address: str, job: str, to: str | Path | None = None, client_port: int = 10001) -> Path:
    """Copy a job's RUN_DIR to `to` (default: ./runs/<its name>, where git and a job's upload never
    look); returns the local folder."""
    try:
        info = client(address).get_job_info(job)
    except RuntimeError as exc:
        raise ConfigError(f"{job}: {str(exc).splitlines()[0]}") from None
    location = run_dir_of(address, job)
    target = Path(to) if to else Path.cwd() / "runs" / location.rstrip("/").rsplit("/", 1)[-1]
    if target.exists() and any(target.iterdir()):
        raise ConfigError(f"--to {target}: exists and is not empty")
    if (
        storage.is_uri(location) or Path(location).is_dir()
    ):  # a URI, or a folder this machine reads (same host, shared filesystem)
        storage.copy_tree(location, str(target))
    else:
        unpack(packed_on_node(address, info.driver_node_id, location, client_port), target)
    return target


def packed_on_node(address: str, node_id: str, location: str, client_port: int) -> bytes:
    """The folder at `location` on node `node_id`, as a tar archive, read by a Ray task placed
    there (over Ray Client: the dashboard's host, `client_port`)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    host = urlparse(address).hostname
    with retried(
        lambda: ray.init(address=f"ray://{host}:{client_port}", logging_level=logging.ERROR),
        "connecting over Ray Client",
    ):
        strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        return ray.get(ray.remote(num_cpus=0, scheduling_strategy=strategy)(pack).remote(location))


def pack(location: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(location, arcname=".")
    return buffer.getvalue()


def unpack(data: bytes, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(target, filter="data")  # no absolute paths, links out, or devices


def validate_address(address: str) -> str:
    """`address` once a Ray dashboard answers there (`GET /api/version`) within
    `actors.driver.cluster.PROBE_S`, else `ConfigError`, one line: not a URL, nothing answering
    (the job client would retry for a minute), something that is not a dashboard, or a head that
    wants a token this process lacks. `rayfl submit`, `fetch` and `pool` probe with it, as
    `run --address` probes a GCS (`actors.driver.cluster.probe`)."""
    import urllib.error
    import urllib.request

    from actors.driver.cluster import PROBE_S

    if not address.startswith(("http://", "https://")):
        raise ConfigError(f"--address: {shown(address, 80)!r} is not a dashboard URL (http://HOST:8265)")
    request = urllib.request.Request(f"{address.rstrip('/')}/api/version", headers=auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=PROBE_S) as answer:
            answered = json.load(answer)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise ConfigError(
                f"--address {shown(address, 80)}: the dashboard wants a token: export RAY_AUTH_TOKEN=<the head's "
                "`ray get-auth-token`> unless ~/.ray/auth_token holds it"
            ) from None
        raise ConfigError(f"--address {shown(address, 80)}: answers HTTP {exc.code}, not as a Ray dashboard") from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ConfigError(
            f"--address {shown(address, 80)}: no Ray dashboard answers there ({shown(str(reason), 80)}); is the head "
            "up, and is this its dashboard (rayfl up prints it)?"
        ) from None
    if not (isinstance(answered, dict) and "ray_version" in answered):
        raise ConfigError(f"--address {shown(address, 80)}: answers, but not as a Ray dashboard")
    return address


def pool_command_on(address: str, action: str, timeout_s: float = 300.0) -> str:
    """`rayfl pool ACTION` on the cluster whose dashboard is `address` (which names no GCS to join),
    run there as a Ray job; its `rayfl pool` lines."""
    from ray.job_submission import JobStatus

    jobs = client(address)
    job = retried(
        lambda: jobs.submit_job(
            entrypoint=f"python -m rayfl pool {shlex.quote(action)}",
            runtime_env={"working_dir": str(REPO_ROOT), "excludes": upload_excludes(REPO_ROOT)},
            metadata={"rayfl": f"pool {action}"},
        ),
        "submitting the job",
    )
    deadline = time.monotonic() + timeout_s
    while (status := jobs.get_job_status(job)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rayfl pool {action}: job {job} did not end within {timeout_s:g} s")
        time.sleep(0.5)
    logs = jobs.get_job_logs(job).splitlines()
    if status != JobStatus.SUCCEEDED:
        raise RuntimeError(f"rayfl pool {action}: job {job} {status.value.lower()}: {(logs or [''])[-1]}")
    return "\n".join(line for line in logs if not line.startswith(("20", "(")))  # Ray's own lines left out

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

import contextlib
import io
import logging
import os
import re
import secrets
import shlex
import sys
import tarfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import urlparse

import yaml

from . import checkpoint, storage
from .config import ConfigError, RunConfig, to_dict
from .configbase import shown
from .engine import Progress, Start, new_run_dir, prepare
from .loader import PATHS

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
        probe(address or os.environ["RAY_ADDRESS"])
        ray.init(address=address, **quiet)
    else:
        ray.init(address="local", include_dashboard=dashboard, dashboard_host="127.0.0.1", **quiet)
    return True


PROBE_S = 5.0
"""Seconds a cluster's address has to accept a connection, and then again to answer as a Ray head."""


def probe(address: str) -> None:
    """`ConfigError` (one line) unless `address` is a Ray head this process may join, found in
    seconds instead of `ray.init`'s minutes of retries: nothing accepts a connection there within
    `PROBE_S`, or it does not answer as a head's GCS, or the head uses token authentication and
    this process has no token for it (then the line says how to pass one). `auto` and `local`
    are left to Ray; a `ray://` address (Ray Client) is checked for a connection only."""
    import socket
    import threading

    if address in ("auto", "local"):
        return
    if address.startswith(("http://", "https://")):
        raise ConfigError(f"--address {shown(address, 80)}: a dashboard's address (rayfl submit takes it); rayfl run and tune take the head's GCS address, HOST:6379")
    client = address.startswith("ray://")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not port.isdigit():
        raise ConfigError(f"--address {shown(address, 80)}: not HOST:PORT (e.g. 127.0.0.1:6379) or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S).close()
    except OSError as exc:
        raise ConfigError(f"--address {shown(address, 80)}: nothing answers there ({exc.strerror or type(exc).__name__}); is the head up, and is this its GCS port (ray start --head --port, default 6379)?") from None
    if client:
        return
    from ray._raylet import GcsClient  # the client ray.init itself makes first (its failures log C++ lines: silenced)

    answer: list[BaseException | None] = []
    thread = threading.Thread(target=lambda: answer.append(_gcs_error(GcsClient, address)), daemon=True)
    with _silent_stderr(thread.is_alive):
        thread.start()
        thread.join(PROBE_S)
    error = answer[0] if answer else TimeoutError()
    if isinstance(error, ray_exceptions().AuthenticationError):
        raise ConfigError(
            f"--address {shown(address, 80)}: the cluster uses token authentication and this process has no valid token: "
            "export RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN=<the head's `ray get-auth-token`> unless ~/.ray/auth_token holds it"
        )
    if error is not None:
        raise ConfigError(f"--address {shown(address, 80)}: accepts connections but does not answer as a Ray head's GCS within {PROBE_S:g} s")


def _gcs_error(gcs_client: Callable[..., Any], address: str) -> BaseException | None:
    try:
        gcs_client(address=address).internal_kv_get(b"rayfl-probe", namespace=None, timeout=PROBE_S)
    except Exception as exc:  # noqa: BLE001 - AuthenticationError, RpcError, or a timeout by version
        return exc
    return None


def ray_exceptions() -> Any:
    import ray.exceptions

    return ray.exceptions


@contextlib.contextmanager
def _silent_stderr(still_talking: Callable[[], bool]) -> Iterator[None]:
    """File descriptor 2 to /dev/null (Ray's C++ writes there directly), restored after; while
    `still_talking()` (a probe thread that outlived its wait and goes on logging), it stays
    there and Python's `sys.stderr` moves to a copy of the original, so rayfl's one line shows."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        if still_talking():
            sys.stderr = os.fdopen(saved, "w", buffering=1)
        else:
            os.dup2(saved, 2)
            os.close(saved)


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
    if not (ray.is_initialized() or address or os.environ.get("RAY_ADDRESS")):
        # A local cluster gets at most this machine's CPUs and the GPUs torch sees (CUDA_VISIBLE_DEVICES
        # respected, as Ray does): refuse before starting it. `auto` needs room for one actor.
        import torch

        count = 1 if config.ray.num_actors == "auto" else config.ray.num_actors
        check_fits(config, count, {"CPU": os.cpu_count() or 1, "GPU": torch.cuda.device_count()}, None)
    connected = connect(address, config.ray.dashboard)
    phase("ray_start")
    actors: list = []
    try:
        coordinator, clients, fed_ref = start_federation(fed, str(run_dir), run_id)
        actors = [coordinator, *clients]
        coordinator_ready = coordinator.warm.remote([fed_ref])
        wait_for_actors(clients, config.ray.actor_timeout_s, log.info, federation_ref=fed_ref)
        ray.get(coordinator_ready)
        phase("actors")
        summary = follow(coordinator, [fed_ref], start, progress, config.ray.actor_timeout_s)
        phase("rounds")
        return summary
    except RayTaskError as exc:  # the round loop raised inside the coordinator: its own error, one line
        raise broke_off(exc.cause, run_dir) from exc
    except RayActorError as exc:
        raise RunFailed(f"the coordinator actor died ({type(exc).__name__}); {resume_hint(run_dir)}") from exc
    except RunFailed as exc:  # the coordinator did not come back
        raise RunFailed(f"{exc}; {resume_hint(run_dir)}") from exc
    finally:
        for actor in actors:
            ray.kill(actor)
        if connected:
            ray.shutdown()
        phase("shutdown")


def follow(coordinator: Any, federation_box: list, start: Start, progress: Progress | None, timeout_s: float) -> dict[str, Any]:
    """The coordinator's rounds from `start`, its finished rows relayed to `progress` and its
    notices logged every 0.5 s while they run; returns the run's summary. A coordinator that
    died and that Ray restarts (`ray.coordinator_restarts`) is waited for (at most `timeout_s`)
    and run again from RUN_DIR's newest checkpoint; the rows it recomputes are not relayed twice."""
    import ray
    from ray.exceptions import ActorUnavailableError

    last, begin = start.state.round, start
    while True:
        done = coordinator.run.remote(federation_box, begin)
        try:
            finished = False
            while not finished:
                finished = bool(ray.wait([done], timeout=0.5)[0])
                rows, notes = ray.get(coordinator.progress.remote())
                for note in notes:
                    log.warning(note)
                for row in rows:
                    if row["round"] > last and progress is not None:
                        progress(row)
                    last = max(last, row["round"])
            return ray.get(done)
        except ActorUnavailableError:  # Ray is restarting it (one that died for good raises ActorDiedError)
            log.warning("the coordinator actor died; Ray restarts it, and it resumes from the newest checkpoint in RUN_DIR")
            wait_until_answers(coordinator, timeout_s)
            begin = None


def wait_until_answers(actor: Any, timeout_s: float) -> None:
    """Block until `actor` answers a call again (Ray restarted it); `RunFailed` after `timeout_s`."""
    import ray
    from ray.exceptions import ActorUnavailableError

    started = time.monotonic()
    while True:
        try:
            ray.get(actor.progress.remote(), timeout=max(1.0, timeout_s - (time.monotonic() - started)))
            return
        except (ActorUnavailableError, ray.exceptions.GetTimeoutError):
            if time.monotonic() - started > timeout_s:
                raise RunFailed(f"the coordinator actor did not come back within ray.actor_timeout_s = {timeout_s:g} s") from None
            time.sleep(0.5)


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
    first = (str(exc).splitlines() or [""])[0]
    return RunFailed(f"{type(exc).__name__}: {first}; {resume_hint(run_dir)}")


def resume_hint(run_dir: Path) -> str:
    if checkpoint.exists(run_dir):
        return f"continue it with: rayfl run --resume {run_dir}"
    return "no checkpoint was written yet; start it again"


T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_DIR_LINE = re.compile(r"^rayfl: RUN_DIR (\S+)\s*$", re.M)
"""The line a run inside a job prints first: where its RUN_DIR is (`fetch` reads it back)."""
PROGRESS_LINE = re.compile(r"^rayfl: round (\d+)/(\d+) acc (\S+) vtime (\S+)s\s*$")
"""The line a run inside a job prints per round (`--progress lines`); `wait` turns it into a bar."""


def auth_headers() -> dict[str, str]:
    """The bearer token the way Ray's clients find it: $RAY_AUTH_TOKEN, the file at
    $RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token. Empty when there is none (auth off)."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()
        if path.is_file():
            token = path.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


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
    jobs = client(address)
    for name in ("ray", "ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk"):  # the SDK sets INFO when imported
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
                "excludes": ["runs/", ".git/", "**/__pycache__/", "*.egg-info/", "site/"],
                "env_vars": {"RAYFL_CONFIG": yaml.safe_dump(portable(config), sort_keys=False)},
            },
            metadata={"algorithm": config.algorithm.name, "dataset": config.data.name, "run_id": name, "out": out or ""},
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


class Quiet:
    """A job's log lines as `rayfl submit --wait` shows them: the run's per-round lines as a bar,
    its `rayfl:` notices and its last line (RUN_DIR and accuracy) as they are, the rest (Ray's
    INFO lines, the config) dropped."""

    def __init__(self, write: Callable[[str], Any]):
        self.write, self.bar = write, None

    def __call__(self, line: str) -> None:
        from tqdm import tqdm

        step = PROGRESS_LINE.match(line)
        if step:
            done, total, acc, vtime = step.groups()
            if self.bar is None:
                self.bar = tqdm(total=int(total), initial=int(done) - 1, unit="round", dynamic_ncols=True)
            self.bar.set_postfix(acc=acc, vtime=f"{float(vtime):.0f}s", refresh=False)
            self.bar.update(1)
        elif line.startswith("rayfl: ") or ": final test accuracy " in line:
            self.close()
            self.write(line + "\n")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def wait(address: str, job: str, verbose: bool = False) -> int:
    """Follow a job until it ends; 0 if it succeeded, 1 otherwise. Quiet (`Quiet`) unless
    `verbose`, which streams every log line."""
    import asyncio
    import sys

    from ray.job_submission import JobStatus

    jobs = client(address)
    quiet = Quiet(sys.stdout.write)

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
        if pending and not verbose:
            quiet(pending)

    asyncio.run(tail())
    quiet.close()
    status = jobs.get_job_status(job)
    if status != JobStatus.SUCCEEDED:
        print(f"rayfl: job {job} {status.value.lower()}", file=sys.stderr)
    return 0 if status == JobStatus.SUCCEEDED else 1


def run_dir_of(address: str, job: str) -> str:
    """The RUN_DIR location a job's run printed."""
    found = RUN_DIR_LINE.search(retried(lambda: client(address).get_job_logs(job), "reading the job's logs"))
    if not found:
        raise ConfigError(f"{job}: its logs name no RUN_DIR (a job not started by rayfl, or not started yet)")
    return found.group(1)


def fetch(address: str, job: str, to: str | Path | None = None, client_port: int = 10001) -> Path:
    """Copy a job's RUN_DIR to `to` (default: ./<its name>); returns the local folder."""
    try:
        info = client(address).get_job_info(job)
    except RuntimeError as exc:
        raise ConfigError(f"{job}: {str(exc).splitlines()[0]}") from None
    location = run_dir_of(address, job)
    target = Path(to) if to else Path.cwd() / location.rstrip("/").rsplit("/", 1)[-1]
    if target.exists() and any(target.iterdir()):
        raise ConfigError(f"--to {target}: exists and is not empty")
    if storage.is_uri(location) or Path(location).is_dir():  # a URI, or a folder this machine reads (same host, shared filesystem)
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
    with ray.init(address=f"ray://{host}:{client_port}", logging_level=logging.ERROR):
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
    if not address.startswith(("http://", "https://")):
        raise ConfigError(f"--address: {address!r} is not a dashboard URL (http://HOST:8265)")
    return address

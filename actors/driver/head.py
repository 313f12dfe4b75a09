"""A local Ray head kept between runs: `rayfl up` starts one (`ray start --head --block` in a
process group of its own, with token authentication as `ray.init` gives a new local cluster),
`rayfl down` stops that one only (by its process group: never `ray stop`, which stops every
Ray cluster on the host). While it is up, `rayfl run` and `rayfl tune` without `--address`
join it, so their actors stay warm in its pool (`actors/keeper.py`) from one run to the next.

Its address, process and Ray temp folder are recorded in `~/rayfl/head.json`; each run on it
(`rayfl run`, a job's driver) holds a file under `~/rayfl/drivers/` while it runs, so that `rayfl
down` stops those runs first, each with its one line and the command that continues it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import psutil

from rayfl.config import ConfigError
from rayfl.storage import HOME

from .. import raystate

RECORD = HOME / "head.json"
DRIVERS = HOME / "drivers"
"""A file per process whose run is on the kept head, named by its pid (`on_the_kept_head`)."""
SYSTEM_CONFIG = {"worker_niceness": 0}
"""Ray's settings for the clusters rayfl starts (a run's own, `rayfl up`'s): the workers at the
driver's priority. Ray starts them at nice 15 behind every other process, so on a machine busy
with other work a run's actors got a few percent of a core (docs/ray.md, "A busy machine")."""


def kept() -> dict[str, Any] | None:
    """The kept head's record (`address`, `pid`, `dashboard`, `log`, `temp_dir`) while its process
    lives; None otherwise."""
    if not RECORD.is_file():
        return None
    record = json.loads(RECORD.read_text())
    try:
        command = psutil.Process(record["pid"]).cmdline()
    except psutil.Error:  # gone, or another user's process under a reused pid
        return None
    port = record["address"].rsplit(":", 1)[-1]
    return record if {"start", "--head", "--block", port} <= set(command) else None


def joining(address: str | None) -> str | None:
    """The running cluster a run joins: `address`, else $RAY_ADDRESS, else the kept head's;
    None: none. Call it before Ray's import: joining the kept head, this process is set up for
    its token authentication; joining none (a cluster of its own) or the kept head on the
    loopback, for a cluster on the loopback (`LOOPBACK`: without it, Ray takes this host's network
    address for the head's 127.0.0.1, and a driver of the kept head waited for a GCS that does not
    listen there)."""
    record = kept()
    address = address or os.environ.get("RAY_ADDRESS") or (record["address"] if record else None)
    kept_head = record is not None and address == record["address"]
    if kept_head:
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    on_loopback = address is None or kept_head and address.startswith("127.0.0.1:")
    if on_loopback and "ray" not in sys.modules:  # Ray reads it at its import: later, it would only reach children
        os.environ.setdefault(*LOOPBACK)
    return address


LOOPBACK = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
"""Ray's switch for a cluster of one host, set for the clusters rayfl starts (a run's own, `rayfl
up`'s without `--node-ip-address`) before Ray's import, which reads it: off, Ray takes the
loopback as the node's address, and its GCS, raylet, agents, metrics export and workers listen on
127.0.0.1 only. With Ray's default (on, outside Windows and macOS) they listen on every interface,
and the metrics export answers anyone without a token (measured with Ray 2.60:
`tests/actors/test_ports.py`). A value the user exported stays (docs/ray.md, "Clusters")."""


def shell_exports(record: dict[str, Any]) -> str:
    """The line a shell evaluates for Ray's own CLI on the kept head (`rayfl up --env`): token
    authentication, the dashboard for its job CLI, and for a head on the loopback Ray's switch for
    one host (`LOOPBACK`), without which `ray status` looks for the head at the host's network
    address."""
    one_host = f" {LOOPBACK[0]}={LOOPBACK[1]}" if record["address"].startswith("127.0.0.1:") else ""
    return f"export RAY_AUTH_MODE=token RAY_API_SERVER_ADDRESS={record['dashboard']}{one_host}"


def dashboard(address: str | None) -> str:
    """The dashboard a job command (`rayfl submit`, `fetch`) talks to: `address`, else
    $RAY_API_SERVER_ADDRESS (as Ray's job CLI reads it), else the kept head's; `ConfigError`, one
    line, when there is none."""
    record = kept()
    found = address or os.environ.get("RAY_API_SERVER_ADDRESS") or (record or {}).get("dashboard")
    if not found:
        held = "the head rayfl up keeps has no dashboard (rayfl down, then rayfl up --dashboard)" if record else ""
        raise ConfigError(
            "--address: no dashboard to submit to: give --address http://HOST:8265, set RAY_API_SERVER_ADDRESS, or "
            f"start a head with rayfl up --dashboard{'; ' + held if held else ''}"
        )
    return found


STOPPING = threading.Event()
"""Set in a run on the kept head when `rayfl down` asks it to stop (`on_the_kept_head`); the
driver's loop over the coordinator's rounds (`follow.follow`) then raises `HeadStopping`. (Raised
from the signal handler itself, the exception surfaced inside Ray's Cython `wait` as a
`SystemError`.)"""


class HeadStopping(RuntimeError):
    """`rayfl down` is stopping the head under the run: raised in the run's main thread while the
    head still answers, so the run hands its actors back and ends with its one line. Waiting for
    the head to go instead lost a race, 1 time in 10: Ray's core worker ends the process at once
    when its local raylet dies ("Exiting because the Raylet IPC connection failed"), before any
    line of rayfl's."""

    def __init__(self) -> None:
        super().__init__("the cluster stopped under the run (rayfl down stopped its head)")


@contextlib.contextmanager
def on_the_kept_head(address: str | None) -> Iterator[None]:
    """While a run joined to the kept head (`address` is its address) runs in this process's main
    thread: its file under `DRIVERS` and a handler that sets `STOPPING` when `down` asks
    (`SIGUSR1`). Elsewhere, nothing."""
    import signal

    record = kept()
    if record is None or address != record["address"] or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopping(signum: int, frame: Any) -> None:
        STOPPING.set()

    STOPPING.clear()
    held = DRIVERS / str(os.getpid())
    DRIVERS.mkdir(parents=True, exist_ok=True)
    before = signal.signal(signal.SIGUSR1, stopping)
    held.write_text(str(psutil.Process().create_time()))  # the pid's process is this one while they match
    try:
        yield
    finally:
        held.unlink(missing_ok=True)
        signal.signal(signal.SIGUSR1, before)
        STOPPING.clear()  # the next run of this process starts unasked


def stop_runs(timeout_s: float = 120.0) -> None:
    """Ask every run on the kept head (`DRIVERS`) to stop (`HeadStopping`), and wait until each has
    ended (at most `timeout_s`: a run hands its actors back first)."""
    import signal

    running = []
    for held in DRIVERS.glob("*") if DRIVERS.is_dir() else ():
        try:  # never a signal to another process under a reused pid (SIGUSR1 would end it)
            if held.read_text() != str(psutil.Process(int(held.name)).create_time()):
                raise ProcessLookupError
            os.kill(int(held.name), signal.SIGUSR1)
            running.append(int(held.name))
        except (ValueError, OSError, psutil.Error):
            held.unlink(missing_ok=True)  # a run that ended without removing it
    deadline = time.monotonic() + timeout_s
    while running and time.monotonic() < deadline:
        running = [pid for pid in running if psutil.pid_exists(pid) and (DRIVERS / str(pid)).exists()]
        time.sleep(0.1)


def free_port(preferred: int = 0) -> int:
    """A port on 127.0.0.1 nothing listens on: `preferred` when it is free, else one the system picks."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken (another head's dashboard, say)
                continue
            return s.getsockname()[1]
    raise OSError("no free port on 127.0.0.1")


SERVICES = (
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
    "ray-client-server-port",
)
"""The head's services besides its GCS and dashboard, each on a free port, so a second Ray head on the
host (another user's, a test's) never takes its agents' or blocks them."""


def ray_cli() -> str:
    """The `ray` command beside the interpreter that runs rayfl (a virtual environment's, used without
    activating it), else the one on PATH."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.is_file() else "ray"


def up(
    num_cpus: int | None,
    num_gpus: int | None,
    dashboard: bool,
    dashboard_port: int | None = None,
    timeout_s: float = 120.0,
    node_ip_address: str | None = None,
) -> dict[str, Any]:
    """Start the kept head (or return the one up); its record. Every port is a free one, the
    dashboard's `dashboard_port` when that one is free (a second head on the host takes another).
    Ray's ports listen on the loopback (`LOOPBACK`), or, given `node_ip_address`, on the network
    with that address for the head (other nodes join it there); the dashboard stays on 127.0.0.1.

    Its Ray temp folder is its own (`--temp-dir`, under `$RAY_TMPDIR` or /tmp as Ray's default
    is): Ray's job supervisor gives a job's entry point the address of the cluster named in its
    head's `ray_current_cluster` file, which in the shared /tmp/ray is the last `ray start` on the
    host (another head, `ray.cluster_utils.Cluster`), so a job submitted to this head ran its
    driver against that other cluster, refused there for its token."""
    record = kept()
    if record is not None:
        return record
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    where, host = listens_on(node_ip_address, env)
    with_token(env)
    port, dash = free_port(), free_port(dashboard_port or 0)
    temp_dir = tempfile.mkdtemp(prefix="rayfl-head-", dir=os.path.abspath(os.environ.get("RAY_TMPDIR") or "/tmp"))
    cmd = [ray_cli(), "start", "--head", "--block", "--port", str(port), "--disable-usage-stats"]  # as kept() reads it
    cmd += ["--temp-dir", temp_dir, *where]
    cmd += ["--system-config", json.dumps(SYSTEM_CONFIG)]
    cmd += [f"--include-dashboard={str(dashboard).lower()}", *(f"--{flag}={free_port()}" for flag in SERVICES)]
    cmd += ["--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash)] if dashboard else []
    cmd += ["--num-cpus", str(num_cpus)] if num_cpus is not None else []
    cmd += ["--num-gpus", str(num_gpus)] if num_gpus is not None else []
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    log = RECORD.with_name("head.log")
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    record = {
        "address": f"{host}:{port}",
        "pid": proc.pid,
        "dashboard": f"http://127.0.0.1:{dash}" if dashboard else None,
        "log": str(log),
        "temp_dir": temp_dir,
    }
    answered(proc, port, record, timeout_s)
    if record["dashboard"] and not serves(record["dashboard"], temp_dir, env):  # again, on a port of the system's
        stop(proc.pid)
        shutil.rmtree(temp_dir, ignore_errors=True)
        if dashboard_port is None:
            raise ConfigError(f"rayfl up: another head's dashboard answers at {record['dashboard']}; see {log}")
        return up(num_cpus, num_gpus, dashboard, None, timeout_s, node_ip_address)
    RECORD.write_text(json.dumps(record))
    return record


def answered(proc: subprocess.Popen, port: int, record: dict[str, Any], timeout_s: float) -> None:
    """Wait until the head `proc` answers: its GCS on `port`, and its dashboard (what rayfl
    submit probes); else stop it, remove its temp folder and raise `ConfigError` naming its log."""
    deadline = time.monotonic() + timeout_s
    while not answers(port, record["dashboard"]):
        if proc.poll() is not None:
            shutil.rmtree(record["temp_dir"], ignore_errors=True)
            raise ConfigError(f"rayfl up: ray start exited with {proc.returncode}; see {record['log']}")
        if time.monotonic() > deadline:
            stop(proc.pid)
            shutil.rmtree(record["temp_dir"], ignore_errors=True)
            raise ConfigError(f"rayfl up: the head did not answer within {timeout_s:g} s; see {record['log']}")
        time.sleep(0.2)


def serves(dashboard: str, temp_dir: str, env: Mapping[str, str]) -> bool:
    """Whether the dashboard at `dashboard` is the head's whose Ray temp folder is `temp_dir`: the
    session it names (`GET /api/version`, with the head's token) is the one under that folder.
    Another dashboard may take a free port between `free_port` and Ray's bind (Ray's own then takes
    the next port): two heads started at once on one host, a `rayfl up` beside a run's own cluster
    (whose dashboard Ray puts on 8265, the port `rayfl up --dashboard-port` prefers)."""
    import urllib.request

    request = urllib.request.Request(f"{dashboard}/api/version", headers=bearer(env))
    try:
        with urllib.request.urlopen(request, timeout=5.0) as answer:
            session = json.load(answer).get("session_name")
    except (OSError, ValueError):  # another head's token, or no dashboard of Ray's
        return False
    return session == Path(temp_dir, "session_latest").resolve().name


def listens_on(node_ip_address: str | None, env: dict[str, str]) -> tuple[list[str], str]:
    """Where the head listens, set in its `env`: on the loopback (`LOOPBACK`, unless the user
    exported the switch), or on the network with `node_ip_address`. Returns `ray start`'s arguments
    for it and the head's host as an address names it."""
    if not node_ip_address:
        env.setdefault(*LOOPBACK)
        return [], "127.0.0.1"
    env[LOOPBACK[0]] = "1"
    return ["--node-ip-address", node_ip_address], f"[{node_ip_address}]" if ":" in node_ip_address else node_ip_address


def with_token(env: Mapping[str, str]) -> None:
    """A token for the head's authentication where Ray looks for one (`bearer`): Ray's
    `get-auth-token --generate` writes the file when there is none."""
    if not bearer(env):
        subprocess.run([ray_cli(), "get-auth-token", "--generate"], env=dict(env), check=True, capture_output=True)


def bearer(env: Mapping[str, str]) -> dict[str, str]:
    """The HTTP header with the token the way Ray's clients find it in `env`: $RAY_AUTH_TOKEN, the
    file at $RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token. Empty when there is none (auth off)."""
    token = env.get("RAY_AUTH_TOKEN", "").strip()
    path = Path(env.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").expanduser()
    if not token and path.is_file():
        token = path.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def answers(port: int, dashboard: str | None) -> bool:
    """Whether the head's GCS accepts a connection and its dashboard (if any) answers HTTP."""
    import urllib.error
    import urllib.request

    try:
        raystate.knock(f"127.0.0.1:{port}", 1.0)
        if dashboard:
            urllib.request.urlopen(f"{dashboard}/api/version", timeout=1.0).close()
    except urllib.error.HTTPError:  # it answers (401 without a token)
        return True
    except OSError:
        return False
    return True


def down(timeout_s: float = 3.0) -> dict[str, Any] | None:
    """Stop the kept head (its whole process group) and remove its Ray temp folder (that of a
    head that died too); its record, None when none was up."""
    record = kept()
    if record is not None:
        stop_runs()
    written = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    RECORD.unlink(missing_ok=True)
    if record is not None:
        stop(record["pid"], timeout_s)
    if written.get("temp_dir"):  # a head an older rayfl started has none of its own
        shutil.rmtree(written["temp_dir"], ignore_errors=True)
    return record


def stop(pid: int, timeout_s: float = 3.0) -> None:
    """SIGTERM to the process group `ray start --block` leads (it stops the head's processes),
    SIGKILL to what is left after `timeout_s` (Ray's own shutdown waits out a 30 s drain); returns
    once the group is gone (at most 10 s after the SIGKILL)."""
    for sig, grace in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)

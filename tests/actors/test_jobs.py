"""A real head node: `rayfl submit --wait`, then the job and the named actors read back over
the dashboard's HTTP API, with token authentication on; `rayfl fetch`, and `ray job submit`.

The head runs in its own process session and is stopped by signalling that process group
only (never `ray stop`, which would also stop this test session's own cluster).
"""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from actors.driver.head import SYSTEM_CONFIG

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("jobs")]  # one head started once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return json.loads(r.read())


def head_logs(temp_dir: str) -> str:
    """The last lines of the head's own logs (GCS, dashboard and its agent)."""
    logs = os.path.join(temp_dir, "session_latest", "logs")
    tails = []
    for name in ("gcs_server.out", "dashboard.log", "dashboard_agent.log", "raylet.out"):
        try:
            with open(os.path.join(logs, name)) as f:
                tails.append(f"--- {name}\n" + "".join(f.readlines()[-15:]))
        except OSError:
            tails.append(f"--- {name}: none")
    return "\n".join(tails)


@pytest.fixture(scope="module")
def head_node():  # one head for the module's jobs (each job has its own id and RUN_DIR)
    temp_dir = tempfile.mkdtemp(prefix="rayfl-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    token = secrets.token_hex(16)
    home = tempfile.mkdtemp(prefix="rayfl-home-")  # a job's default RUN_DIR is ~/rayfl/runs/<job id> on the head
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "HOME": home}
    env.pop("RAY_ADDRESS", None)
    dash, client_port, gcs_port = free_port(), free_port(), free_port()
    cmd = [
        "ray",
        "start",
        "--head",
        "--block",
        f"--port={gcs_port}",
        f"--dashboard-port={dash}",
        "--dashboard-host=127.0.0.1",
        "--num-cpus=2",
        "--disable-usage-stats",
        # The agents' ports too: a cluster's agents linger about 60 s after it stops (the node drill's,
        # just before), and an agent that cannot bind Ray's default port leaves the head without one.
        *(
            f"--{flag}={free_port()}"
            for flag in (
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "runtime-env-agent-port",
                "metrics-export-port",
            )
        ),
        f"--temp-dir={temp_dir}",
        f"--ray-client-server-port={client_port}",
        f"--system-config={json.dumps(SYSTEM_CONFIG)}",  # as `rayfl up` starts its head (docs/ray.md, "A busy machine")
    ]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/gcs_healthz", timeout=2)
                get(f"{url}/api/version", token)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the head node did not come up:\n{head_logs(temp_dir)}")
                time.sleep(0.5)
        # and a job runs: a head whose dashboard agent has not registered yet answers every
        # submission with "No available agent" (seen on a busy machine after the node drill)
        while subprocess.run(
            ["ray", "job", "submit", "--address", url, "--", "true"], env=env, capture_output=True
        ).returncode:
            if time.time() > deadline + 60 or proc.poll() is not None:
                raise RuntimeError(f"the head node runs no job:\n{head_logs(temp_dir)}")
            time.sleep(1)
        yield url, token, env, client_port, gcs_port
        if proc.poll() is not None:  # the head died under the module's tests: say why, if its logs do
            print(head_logs(temp_dir))
    finally:
        # `ray start --block` takes over 10 s to follow a SIGTERM here: after 2 s, SIGKILL the group.
        for sig, grace in ((signal.SIGTERM, 2), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(grace)
                break
            except subprocess.TimeoutExpired:
                continue
        shutil.rmtree(temp_dir, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def test_submit_wait_then_read_the_job_and_actors_from_the_dashboard(head_node, tmp_path):
    url, token, env, _, _ = head_node
    with pytest.raises(urllib.error.HTTPError) as denied:  # auth is on: no token, no answer
        get(f"{url}/api/jobs/")
    assert denied.value.code == 401

    run_dir = tmp_path / "job-run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayfl",
            "submit",
            "--address",
            url,
            "--wait",
            "--out",
            str(run_dir),
            "--set",
            "federation.rounds=2",
            "--set",
            "model.name=mlp",
            "--set",
            "ray.num_actors=2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    job_id = out.stdout.splitlines()[0].strip()
    assert re.fullmatch(r"rayfl-fedavg-digits-\d{8}-\d{6}-[0-9a-f]{4}", job_id), job_id
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2
    # Quiet: the RUN_DIR line, the bar, the final line; no config, no Ray INFO lines.
    assert f"rayfl: RUN_DIR {run_dir}" in out.stdout and f"{run_dir}: final test accuracy" in out.stdout
    assert "federation:" not in out.stdout + out.stderr and "INFO" not in out.stdout + out.stderr

    jobs = {j["submission_id"]: j for j in get(f"{url}/api/jobs/", token)}
    assert jobs[job_id]["status"] == "SUCCEEDED"
    assert jobs[job_id]["metadata"] == {
        "algorithm": "fedavg",
        "dataset": "digits",
        "run_id": job_id,
        "out": str(run_dir),
    }
    assert jobs[job_id]["entrypoint"].startswith("python -m rayfl run --config-env RAYFL_CONFIG")
    assert get(f"{url}/api/jobs/{job_id}", token)["status"] == "SUCCEEDED"

    # The job's actors outlive it, warm in the cluster's pool for the next run (actors/keeper.py).
    actors = get(f"{url}/api/v0/actors?limit=200", token)["data"]["result"]["result"]
    alive = sorted(
        (a["name"].rsplit("-", 1)[0], a["class_name"])
        for a in actors
        if a["state"] == "ALIVE" and a["name"].startswith("rayfl:pool")
    )
    assert alive == [
        ("rayfl:pool", "Keeper"),
        ("rayfl:pool:client", "ClientActor"),
        ("rayfl:pool:client", "ClientActor"),
        ("rayfl:pool:coordinator", "Coordinator"),
    ]


def test_a_failing_job_returns_non_zero(head_node, tmp_path):
    url, token, env, _, _ = head_node
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayfl",
            "submit",
            "--address",
            url,
            "--wait",
            "--set",
            "data.name=cifar10",
            "--set",
            f"data.data_dir={tmp_path}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # The job's run finds no CIFAR-10 under data_dir: the job fails and --wait says so, then shows
    # the job's last log lines (what the quiet view dropped, a traceback's tail, is there too).
    assert out.returncode == 1
    said = out.stderr.split("\n")
    failed = next(i for i, line in enumerate(said) if line.startswith("rayfl: job rayfl-fedavg-cifar10-"))
    assert said[failed].endswith(" failed") and said[failed + 1].startswith("rayfl: its last ")
    assert any("cifar10 not found" in line for line in said[failed + 2 :]), out.stderr


def test_a_job_without_out_lands_under_home_and_fetch_brings_it_back(head_node, tmp_path):
    url, token, env, client_port, _ = head_node
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayfl",
            "submit",
            "--address",
            url,
            "--wait",
            "--fetch",
            "--to",
            str(tmp_path / "here"),
            "--set",
            "federation.rounds=1",
            "--set",
            "model.name=mlp",
            "--set",
            "ray.num_actors=1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    job_id = out.stdout.splitlines()[0].strip()
    on_head = os.path.join(env["HOME"], "rayfl", "runs", job_id)  # absolute, outside Ray's session folder
    assert f"rayfl: RUN_DIR {on_head}" in out.stdout and f"{on_head}: final test accuracy" in out.stdout
    assert (tmp_path / "here" / "summary.json").read_text() == open(os.path.join(on_head, "summary.json")).read()
    # The same RUN_DIR through a Ray task on the job's node (Ray Client), as for a head this machine cannot read.
    code = (
        "import sys, pathlib; from rayfl import api; "
        f"info = api.client({url!r}).get_job_info({job_id!r}); "
        f"api.unpack(api.packed_on_node({url!r}, info.driver_node_id, {on_head!r}, {client_port}), "
        f"pathlib.Path({str(tmp_path / 'remote')!r}))"
    )
    remote = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert remote.returncode == 0, remote.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "remote").iterdir()) == sorted(os.listdir(on_head))


def test_ray_job_submit_as_the_readme_shows_it(head_node, tmp_path):
    url, token, env, _, _ = head_node
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [
            "ray",
            "job",
            "submit",
            "--address",
            url,
            "--working-dir",
            ".",
            "--",
            "rayfl",
            "run",
            "--set",
            "federation.rounds=1",
            "--set",
            "model.name=mlp",
            "--set",
            "ray.num_actors=1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=repo,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    job_id = re.search(r"Job '(\S+)' succeeded", out.stdout + out.stderr).group(1)
    assert f"rayfl: RUN_DIR {os.path.join(env['HOME'], 'rayfl', 'runs', job_id)}" in out.stdout + out.stderr


def test_joining_the_token_head_without_its_token_says_how_to_pass_it(head_node, tmp_path):
    url, token, env, _, gcs_port = head_node
    bare = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")} | {"HOME": str(tmp_path)}  # no token anywhere
    address = f"127.0.0.1:{gcs_port}"
    run = [
        sys.executable,
        "-m",
        "rayfl",
        "run",
        "--address",
        address,
        "--set",
        "federation.rounds=1",
        "--set",
        "model.name=mlp",
    ]
    done = subprocess.run(run, env=bare, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"rayfl: error: --address {address}: the cluster uses token authentication and this process has no valid "
        "token: "
        "export RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN=<the head's `ray get-auth-token`> unless ~/.ray/auth_token "
        "holds it"
    ], done.stderr
    assert list(tmp_path.iterdir()) == []
    done = subprocess.run(
        [*run, "--out", "run"],
        env={**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "final test accuracy" in done.stdout, done.stderr[-2000:]

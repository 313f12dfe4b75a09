"""A real head node: `rayfl submit --wait`, then the job and the named actors read back over
the dashboard's HTTP API, with token authentication on.

The head runs in its own process session and is stopped by signalling that process group
only (never `ray stop`, which would also stop this test session's own cluster).
"""

import json
import os
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

pytestmark = pytest.mark.ray


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def head_node():  # one head for the module's jobs (each job has its own id and RUN_DIR)
    temp_dir = tempfile.mkdtemp(prefix="rayfl-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    token = secrets.token_hex(16)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    env.pop("RAY_ADDRESS", None)
    dash = free_port()
    cmd = [
        "ray", "start", "--head", "--block", f"--port={free_port()}", f"--dashboard-port={dash}",
        "--dashboard-host=127.0.0.1", "--num-cpus=2", "--disable-usage-stats",
        f"--temp-dir={temp_dir}", f"--ray-client-server-port={free_port()}",
    ]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/gcs_healthz", timeout=2)
                get(f"{url}/api/version", token)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("the head node did not come up")
                time.sleep(0.5)
        yield url, token, env
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


def test_submit_wait_then_read_the_job_and_actors_from_the_dashboard(head_node, tmp_path):
    url, token, env = head_node
    with pytest.raises(urllib.error.HTTPError) as denied:  # auth is on: no token, no answer
        get(f"{url}/api/jobs/")
    assert denied.value.code == 401

    run_dir = tmp_path / "job-run"
    out = subprocess.run(
        [sys.executable, "-m", "rayfl", "submit", "--address", url, "--wait", "--out", str(run_dir),
         "--set", "federation.rounds=2", "--set", "model.name=mlp", "--set", "ray.num_actors=2"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    job_id = out.stdout.splitlines()[0].strip()
    assert job_id.startswith("raysubmit_")
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2

    jobs = {j["submission_id"]: j for j in get(f"{url}/api/jobs/", token)}
    assert jobs[job_id]["status"] == "SUCCEEDED"
    assert get(f"{url}/api/jobs/{job_id}", token)["status"] == "SUCCEEDED"

    actors = get(f"{url}/api/v0/actors?limit=200", token)["data"]["result"]["result"]
    names = {a["name"] for a in actors}
    run_id = run_dir.name
    assert {f"rayfl:{run_id}:coordinator", f"rayfl:{run_id}:client-0", f"rayfl:{run_id}:client-1"} <= names
    classes = {a["name"]: a["class_name"] for a in actors}
    assert classes[f"rayfl:{run_id}:coordinator"] == "Coordinator"
    assert classes[f"rayfl:{run_id}:client-0"] == "ClientActor"


def test_a_failing_job_returns_non_zero(head_node, tmp_path):
    url, token, env = head_node
    out = subprocess.run(
        [sys.executable, "-m", "rayfl", "submit", "--address", url, "--wait", "--set", "data.name=cifar10", "--set", f"data.data_dir={tmp_path}"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    # The job's run finds no CIFAR-10 under data_dir: the job fails and --wait says so.
    assert out.returncode == 1
    assert "cifar10 not found" in out.stdout + out.stderr

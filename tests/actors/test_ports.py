"""A local cluster that rayfl starts listens on the loopback only (issue 53: with Ray's default
its GCS, raylet, agents and workers listened on every interface, and the metrics export answered
anyone without a token; `actors.driver.head.LOOPBACK`). `rayfl up`'s head: `tests/actors/test_warm.py`."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from tests.actors.ports_drill import loopback


def test_a_runs_own_cluster_listens_on_the_loopback_only(tmp_path):
    ray_tmp = tempfile.mkdtemp(prefix="rp-", dir="/tmp")  # short: Ray's socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path / "home"), RAY_TMPDIR=ray_tmp)  # no kept head to join
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.actors.ports_drill", str(tmp_path / "run")],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert "sockets" in seen, f"no metrics export on 127.0.0.1 and client actors within 2 minutes: {seen['last']}"
    sockets = seen["sockets"]
    names = {name for _, _, name in sockets}
    assert {"gcs_server", "raylet", "ray::DashboardAgent"} <= names, sockets  # the listing sees Ray's processes
    assert any(name.startswith("ray::ClientActor") for name in names), sockets  # and the actors' workers
    assert [s for s in sockets if not loopback(s[0])] == []
    assert seen["network"] and seen["reached"] == []  # this host has addresses, and the metrics export is not on them

"""A local cluster that rayfl starts listens on the loopback only (issue 53: with Ray's default
its GCS, raylet, agents and workers listened on every interface, and the metrics export answered
anyone without a token; `actors.driver.head.LOOPBACK`). `rayfl up`'s head: `tests/actors/test_warm.py`."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

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


class Dashboard:
    """An HTTP server on a free loopback port answering `GET /api/version` as a Ray dashboard of
    `session`, or 401 to every request (a token-protected head whose token this process lacks)."""

    def __init__(self, session=None):
        import http.server

        outer = self

        class Answer(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"ray_version": "2.60.0", "session_name": outer.session}).encode()
                self.send_response(401 if outer.session is None else 200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.session = session
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_rayfl_up_tells_its_own_dashboard_from_one_that_took_its_port_first(tmp_path):
    # `free_port` finds the port free, but another dashboard (a run's own cluster puts Ray's on
    # 8265, which `rayfl up --dashboard-port` prefers) may bind it before the head's does: the
    # record then named that other head's dashboard (a README tour under load: "the dashboard
    # wants a token"). The dashboard is the head's when its session is the one in its temp folder.
    from actors.driver.head import serves

    (tmp_path / "session_2026-11-28_16-05-24_1").mkdir()
    (tmp_path / "session_latest").symlink_to(tmp_path / "session_2026-11-28_16-05-24_1")
    ours, theirs, locked = Dashboard("session_2026-11-28_16-05-24_1"), Dashboard("session_other"), Dashboard()
    try:
        assert serves(ours.url, str(tmp_path), {})
        assert not serves(theirs.url, str(tmp_path), {})  # another head's session
        assert not serves(locked.url, str(tmp_path), {"RAY_AUTH_TOKEN": "mine"})  # our token refused there
    finally:
        for d in (ours, theirs, locked):
            d.server.shutdown()


def test_rayfl_up_starts_again_on_another_port_when_its_dashboard_port_was_taken(tmp_path, monkeypatch):
    from actors.driver import head

    started, answered, real = [], iter([False, True]), subprocess.Popen  # the first head's port was taken

    class Head:  # `ray start --block` as a process group of its own
        def __init__(self, cmd, **kwargs):
            started.append(cmd)
            self.proc = real(["sleep", "60"], start_new_session=True)
            self.pid = self.proc.pid
            threading.Thread(target=self.proc.wait, daemon=True).start()  # reaped once `head.stop` ends it

        def poll(self):
            return self.proc.poll()

    monkeypatch.setattr(head, "RECORD", tmp_path / "rayfl" / "head.json")
    monkeypatch.setattr(head, "kept", lambda: None)
    monkeypatch.setattr(head, "with_token", lambda env: None)
    monkeypatch.setattr(head, "answers", lambda port, dashboard: True)
    monkeypatch.setattr(head, "serves", lambda dashboard, temp_dir, env: next(answered))
    monkeypatch.setattr(head.subprocess, "Popen", Head)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    record = head.up(2, 0, dashboard=True, dashboard_port=8265)
    ports = [int(cmd[cmd.index("--dashboard-port") + 1]) for cmd in started]
    assert len(started) == 2 and record["dashboard"] == f"http://127.0.0.1:{ports[1]}"
    assert json.loads(head.RECORD.read_text()) == record
    assert [p.name for p in tmp_path.glob("rayfl-head-*")] == [Path(record["temp_dir"]).name]  # the first one's removed
    head.stop(record["pid"])

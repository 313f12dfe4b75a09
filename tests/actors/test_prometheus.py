"""rayfl's series as a user's Prometheus sees them, and the Grafana dashboard that charts them.

The Prometheus test runs `rayfl run` on its own local Ray cluster (with the dashboard, whose
reporter writes the service discovery file) and a real Prometheus server (Debian's `prometheus`
package; `.ci/run` installs it) scraping every target of that file each second, then asks
Prometheus's HTTP API for every `ray_rayfl_*` series while the run is in progress.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

PROMETHEUS = shutil.which("prometheus")
DASHBOARD = Path(__file__).resolve().parents[2] / "cluster" / "grafana" / "rayfl.json"

SERIES = {
    "ray_rayfl_round",
    "ray_rayfl_test_accuracy",
    "ray_rayfl_test_loss",
    "ray_rayfl_train_loss",
    "ray_rayfl_virtual_time_s",
    "ray_rayfl_round_virtual_s",
    "ray_rayfl_round_wall_s",
    "ray_rayfl_mean_wait_s",
    "ray_rayfl_mean_staleness",
    "ray_rayfl_max_staleness",
    "ray_rayfl_actors_alive",
    "ray_rayfl_bytes_total",
    "ray_rayfl_clients_total",
}
"""Every series the coordinator exports, as scraped (Ray adds `ray_`, and `_total` to counters)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params: str) -> dict:
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=5) as r:
            return json.load(r)

    def query(self, promql: str) -> list[dict]:
        return self.get("/api/v1/query", query=promql)["data"]["result"]

    def names(self, run_id: str) -> set[str]:
        """The rayfl series names carrying this run's `run_id` tag."""
        found = self.get("/api/v1/series", **{"match[]": f'{{__name__=~"ray_rayfl_.+", run_id="{run_id}"}}'})["data"]
        return {s["__name__"] for s in found}


@pytest.mark.ray
@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary: apt install prometheus (.ci/run does)")
def test_prometheus_scrapes_every_rayfl_series_of_a_run_in_progress(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))  # short: Ray's socket paths live under it
    run_dir = tmp_path / "run"
    port = free_port()
    config = base / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: ray\n"
        f"    file_sd_configs: [{{files: ['{base}/ray/prom_metrics_service_discovery.json'], refresh_interval: 1s}}]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=str(base), RAY_metrics_report_interval_ms="1000")
    # deadline rounds carrying late updates: the staleness series and late clients are exported too
    sets = [
        "data.num_clients=20",
        "federation.clients_per_round=4",
        "model.name=mlp",
        "federation.rounds=5000",
        "federation.checkpoint_every=0",
    ]
    sets += ["federation.mode=deadline", "federation.deadline.over_selection=0.5", "federation.deadline.late=carry"]
    sets += ["ray.num_actors=2", "ray.cpus_per_actor=0.5", "metrics.tensorboard=false"]
    sets += ["ray.start_in_process=false"]  # on Ray whatever the load (a busy machine keeps a short run in the driver)
    prom_log, run_log = (
        open(tmp_path / "prometheus.log", "w"),
        open(tmp_path / "run.err", "w"),
    )  # files: a full pipe would block
    prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={base / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=prom_log,
        stderr=subprocess.STDOUT,
    )
    # Ctrl-C's handler set in the run itself: a background job (CI's, say) inherits SIGINT ignored.
    argv = ["run", "--out", str(run_dir), *[a for s in sets for a in ("--set", s)]]
    launch = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"from rayfl.cli import main; sys.exit(main({argv!r}))"
    )
    run = subprocess.Popen(
        [sys.executable, "-c", launch],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=run_log,
        start_new_session=True,  # its own process group, with the Ray processes it starts
    )
    p = Prometheus(f"http://127.0.0.1:{port}")
    run_id = run_dir.name
    try:
        deadline, names = time.monotonic() + 300, set()
        while time.monotonic() < deadline and run.poll() is None:
            try:
                names = p.names(run_id)
            except OSError:  # Prometheus still starting
                pass
            if names >= SERIES and p.query(
                f'count_over_time(ray_rayfl_round{{run_id="{run_id}"}}[1m]) >= 5'
            ):  # 5 scrapes
                break
            time.sleep(1)
        assert run.poll() is None, (
            f"the run ended before Prometheus saw it: {(tmp_path / 'run.err').read_text()[-2000:]}"
        )
        assert SERIES - names == set(), (
            f"series Prometheus never saw: {sorted(SERIES - names)} "
            f"({(tmp_path / 'prometheus.log').read_text()[-1000:]})"
        )

        def values(promql: str) -> list[float]:
            result = p.query(promql)
            assert result, promql
            return [float(v) for _, v in result[0]["values"]]

        for name in SERIES:
            for series in p.get("/api/v1/series", **{"match[]": f'{name}{{run_id="{run_id}"}}'})["data"]:
                assert series["algorithm"] == "fedavg", series
        for title, exprs in dashboard_panels().items():  # every Grafana panel charts this run
            for expr in exprs:
                assert p.query(expr.replace("$run_id", run_id)), f"{title}: {expr}"
        selector = f'run_id="{run_id}"'
        rounds = values(f"ray_rayfl_round{{{selector}}}[1m]")
        assert rounds == sorted(rounds) and rounds[-1] > rounds[0] >= 1
        virtual = values(f"ray_rayfl_virtual_time_s{{{selector}}}[1m]")
        assert virtual == sorted(virtual) and virtual[-1] > virtual[0] > 0
        sent = values(f"ray_rayfl_bytes_total{{{selector}}}[1m]")
        assert sent == sorted(sent) and sent[-1] > sent[0] > 0
        assert all(0 <= a <= 1 for a in values(f"ray_rayfl_test_accuracy{{{selector}}}[1m]"))
        assert all(w >= 0 for w in values(f"ray_rayfl_mean_wait_s{{{selector}}}[1m]"))
        assert all(d > 0 for d in values(f"ray_rayfl_round_virtual_s{{{selector}}}[1m]"))
        assert all(d > 0 for d in values(f"ray_rayfl_round_wall_s{{{selector}}}[1m]"))
        assert set(values(f"ray_rayfl_actors_alive{{{selector}}}[1m]")) == {2.0}
        # 6 selected a round, closed at the 4th update: 4 fresh updates a round counted `ok`, and
        # the carried ones; the other 2 counted `late`, once per finished round.
        per_round = lambda status: float(
            p.query(
                f'ray_rayfl_clients_total{{{selector}, status="{status}"}} / ignoring(status) '
                f"ray_rayfl_round{{{selector}}}"
            )[0]["value"][1]
        )
        assert 4 - 0.5 <= per_round("ok") <= 6 + 0.5 and per_round("late") == pytest.approx(2, abs=0.5)
        assert all(0 <= s for s in values(f"ray_rayfl_mean_staleness{{{selector}}}[1m]"))
    finally:
        run.send_signal(signal.SIGINT)  # what Ctrl-C does: the run stops its actors and its cluster
        try:
            code = run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            raise
        finally:
            prom.terminate()
            prom.wait(timeout=30)
            prom_log.close()
            run_log.close()
            shutil.rmtree(base, ignore_errors=True)
    assert code == 130 and "interrupted" in (tmp_path / "run.err").read_text()


def test_the_series_list_is_what_the_coordinator_declares():
    # Checked without Prometheus too: a series dropped from the coordinator fails here.
    from actors.coordinator.dashboard import DashboardMetrics as D

    gauges = {*D.GAUGES, D.ROUND_WALL[0], D.ACTORS_ALIVE[0]}
    assert SERIES == {f"ray_{n}" for n in gauges} | {f"ray_{D.BYTES[0]}_total", f"ray_{D.CLIENTS[0]}_total"}


def dashboard_panels() -> dict[str, list[str]]:
    """Panel title -> its PromQL expressions."""
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in json.loads(DASHBOARD.read_text())["panels"]}


def test_every_grafana_panel_charts_series_the_coordinator_exports():
    panels = {
        title: {m for e in exprs for m in re.findall(r"\bray_rayfl_\w+", e)}
        for title, exprs in dashboard_panels().items()
    }
    assert len(panels) >= 8
    for title, names in panels.items():
        assert names and names <= SERIES, f"{title}: {sorted(names - SERIES) or 'no rayfl series'}"
    assert set().union(*panels.values()) == SERIES  # and every series has a panel

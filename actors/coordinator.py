"""The coordinator actor: hosts one federation's round loop on Ray.

It owns the global model, the server policy, the device population, the virtual clock and
the metrics writer (the federation the driver built, read from the object store), and runs the
core's `run_federation` with a `RayExecutor` over the client actors, so its metrics equal the
in-process runner's. It is a threaded actor: `run` drives the rounds while
`progress` answers the driver. It runs on the head node by default, and Ray restarts it where
it dies anyway; the driver then runs it again from RUN_DIR's newest checkpoint (`rayfl.api.follow`).
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

import ray
from ray.exceptions import ActorUnavailableError
from ray.util import metrics as ray_metrics

from actors.client import restore_rng_states, rng_states
from actors.pool import Abandoned, RayExecutor
from actors.warm import HEAD_RESOURCE, NAMESPACE
from rayfl import checkpoint
from rayfl.config import RunConfig
from rayfl.engine import Federation, Progress, Start, run_federation, start_of, torch_threads


class DashboardMetrics:
    """The round rows as series on Ray's metrics endpoint, tagged with run id and algorithm.

    Ray serves each name with a `ray_` prefix (and counters with a `_total` suffix) on every
    node's Prometheus endpoint: `rayfl_test_accuracy` is scraped as `ray_rayfl_test_accuracy`,
    `rayfl_bytes` as `ray_rayfl_bytes_total`. `cluster/grafana/rayfl.json` charts them.
    """

    TAGS = ("run_id", "algorithm")
    GAUGES = {  # name -> (description, the row's column)
        "rayfl_round": ("last finished round", "round"),
        "rayfl_test_accuracy": ("test accuracy of the global model (evaluated rounds)", "test_accuracy"),
        "rayfl_test_loss": ("test loss of the global model (evaluated rounds)", "test_loss"),
        "rayfl_train_loss": ("mean training loss of the round's accepted clients", "train_loss"),
        "rayfl_virtual_time_s": ("virtual clock at the end of the round, seconds", "virtual_time_s"),
        "rayfl_round_virtual_s": (
            "the round's duration on the virtual clock (its slowest client), seconds",
            "round_time_s",
        ),
        "rayfl_mean_wait_s": ("the round's mean client waiting time on the virtual clock, seconds", "mean_wait_s"),
        "rayfl_mean_staleness": (
            "mean staleness (server steps) of the updates a deadline or async step aggregated",
            "mean_staleness",
        ),
        "rayfl_max_staleness": (
            "largest staleness (server steps) of the updates a deadline or async step aggregated",
            "max_staleness",
        ),
    }
    ROUND_WALL = (
        "rayfl_round_wall_s",
        "wall seconds between this round's row and the previous one (rounds overlap with evaluation)",
    )
    ACTORS_ALIVE = ("rayfl_actors_alive", "client actors whose last call did not die")
    BYTES = ("rayfl_bytes", "bytes exchanged with clients since this coordinator started")
    CLIENTS = (
        "rayfl_clients",
        "selected clients by outcome (status: ok, failed, rejected, skipped, late) since this coordinator started",
    )
    OUTCOMES = {
        "ok": "num_clients",
        "failed": "num_failed",
        "rejected": "num_rejected",
        "skipped": "num_skipped",
        "late": "num_late",
    }

    def __init__(self, run_id: str, algorithm: str, wall_time_s: float = 0.0):
        self.tags = {"run_id": run_id, "algorithm": algorithm}
        self.wall_time_s = wall_time_s  # the run's wall clock at the previous row
        self.gauges = {
            name: ray_metrics.Gauge(name, text, tag_keys=self.TAGS) for name, (text, _) in self.GAUGES.items()
        }
        self.round_wall = ray_metrics.Gauge(*self.ROUND_WALL, tag_keys=self.TAGS)
        self.actors_alive = ray_metrics.Gauge(*self.ACTORS_ALIVE, tag_keys=self.TAGS)
        self.bytes = ray_metrics.Counter(*self.BYTES, tag_keys=self.TAGS)
        self.clients = ray_metrics.Counter(*self.CLIENTS, tag_keys=(*self.TAGS, "status"))

    def record(self, row: Mapping[str, Any], actors_alive: int) -> None:
        for name, (_, column) in self.GAUGES.items():
            value = row.get(column, math.nan)  # staleness: deadline and async rows only
            if value == value:  # not NaN: a round without evaluation keeps the last accuracy
                self.gauges[name].set(value, tags=self.tags)
        self.round_wall.set(row["wall_time_s"] - self.wall_time_s, tags=self.tags)
        self.wall_time_s = row["wall_time_s"]
        self.actors_alive.set(actors_alive, tags=self.tags)
        if row["bytes_up"] + row["bytes_down"] > 0:  # Ray's counters refuse an increment of 0
            self.bytes.inc(row["bytes_up"] + row["bytes_down"], tags=self.tags)
        for status, column in self.OUTCOMES.items():
            if row.get(column, 0) > 0:
                self.clients.inc(row[column], tags={**self.tags, "status": status})


log = logging.getLogger("rayfl")


@dataclass(frozen=True)
class Duty:
    """What a coordinator host runs: the federation (boxed, so its reference stays unresolved),
    the client actors, RUN_DIR and the run's key (its dashboard series' `run_id` tag)."""

    federation_box: list
    clients: list
    run_dir: str
    key: str


def same_run(a: Duty, b: Duty) -> bool:
    """Whether two duties are one run's (its key and its federation in the object store)."""
    return a.key == b.key and a.federation_box[0].hex() == b.federation_box[0].hex()


@ray.remote(max_concurrency=3)
class Coordinator:
    """The round loop on Ray, for one run at a time. Its constructor takes nothing (Ray restarts
    it with that, and a pooled host serves one run after another, `reset` between them): each
    `warm` and `run` call brings its run's `Duty`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = threading.Lock()  # one run at a time (a driver that lost touch asks again)
        self.stop = threading.Event()
        self.born = rng_states("cpu")
        self._clear()

    def _clear(self) -> None:
        self.fed: Federation | None = None
        self.duty: Duty | None = None
        self.executor: RayExecutor | None = None
        self.metrics: DashboardMetrics | None = None
        self._rows: list[dict[str, Any]] = []
        self._notes: list[str] = []

    def _attach(self, duty: Duty) -> Federation:
        """The federation and its client actors, once per run. Holding the reference keeps the
        federation (and its dataset) in the object store for as long as the run, which a
        restarting client needs."""
        with self._lock:
            if self.duty is None or not same_run(self.duty, duty):
                fed = ray.get(duty.federation_box[0])
                cfg = fed.config
                self.executor = RayExecutor(
                    duty.clients,
                    duty.federation_box[0],
                    fed.account,
                    timeout_s=cfg.ray.actor_timeout_s,
                    max_failed_fraction=cfg.federation.max_failed_fraction,
                    report=self._note,
                    stop=self.stop,
                )
                self.fed, self.duty = fed, duty
        return self.fed

    def warm(self, duty: Duty) -> None:
        """While the client actors warm up: the libraries the round loop writes tables with, the
        global model's measured cost and an evaluation of it (first-call set-up)."""
        import pyarrow.parquet  # noqa: F401  (what `Recorder` writes with)

        from rayfl import metrics  # noqa: F401

        fed = self._attach(duty)
        with torch_threads():
            fed.cost_of(fed.policy.global_model())
            fed.evaluator(fed.initial_weights(), fed.policy.global_model())

    def run(self, duty: Duty, start: Start | None) -> dict[str, Any]:
        """The rounds from `start`; None (a coordinator Ray restarted): from RUN_DIR's newest
        checkpoint, or from round 0 where none was written."""
        fed = self._attach(duty)
        with self._running:
            if start is None:
                start = start_of(fed, duty.run_dir, resume=checkpoint.exists(duty.run_dir))
                with self._lock:  # the rows up to the checkpoint, for a driver that had not read them all
                    self._rows += [dict(row) for row in start.recorder.rounds]
            elapsed = start.recorder.rounds[-1]["wall_time_s"] if start.recorder.rounds else 0.0
            self.metrics = DashboardMetrics(
                duty.key, fed.config.algorithm.name, elapsed
            )  # the key: two runs' series never mix
            with torch_threads():
                return run_federation(fed, self.executor, duty.run_dir, start, self._on_round)

    def _on_round(self, row: Mapping[str, Any]) -> None:
        if self.stop.is_set():
            raise Abandoned(f"the run stopped after round {row['round']}: its driver is gone")
        self.metrics.record(row, self.executor.alive())
        with self._lock:
            self._rows.append(dict(row))

    def _note(self, line: str) -> None:
        with self._lock:
            self._notes.append(line)

    def progress(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Round rows finished and notices (the pool's: actors lost, rounds run again) since the last call."""
        with self._lock:
            rows, self._rows = self._rows, []
            notes, self._notes = self._notes, []
        return rows, notes

    def abandon(self, key: str) -> None:
        """Stop the run `key` if it is the one in progress, at its next wait for clients or round
        end (`Abandoned`); a later run that borrowed this host meanwhile is left alone."""
        with self._lock:
            if self.duty is not None and self.duty.key == key:
                self.stop.set()

    def reset(self) -> bool:
        """Stop the run in progress, if any, and once it ended forget it (federation, executor,
        rows, the global RNGs' draws) as if just started; returns True."""
        self.stop.set()
        with self._running, self._lock:
            self._clear()
            restore_rng_states(self.born)
            self.stop.clear()
        gc.collect()
        gc.freeze()  # what outlives a run (modules, caches) is not scanned again: the next reset takes milliseconds
        return True


def coordinator_options(config: RunConfig, name: str, pooled: bool) -> dict[str, Any]:
    """Where the coordinator runs (`ray.coordinator_node`: the head node by default, where losing
    it is least likely) and how often Ray restarts it (`ray.coordinator_restarts`). A run's own
    coordinator inside a placement group (a Tune trial's) is placed by the group: its bundles
    hold no node resource; a pooled one is detached and placed outside any group."""
    node = config.ray.coordinator_node
    placed_by_group = not pooled and ray.util.get_current_placement_group() is not None
    resources = {} if node == "any" or placed_by_group else {HEAD_RESOURCE if node == "head" else node: 0.001}
    where = dict(lifetime="detached", scheduling_strategy="DEFAULT") if pooled else {}
    return dict(
        name=name,
        namespace=NAMESPACE,
        num_cpus=0,
        resources=resources,
        max_restarts=config.ray.coordinator_restarts,
        max_task_retries=0,
        **where,
    )


def follow(coordinator: Any, duty: Duty, start: Start, progress: Progress | None, timeout_s: float) -> dict[str, Any]:
    """The coordinator's rounds from `start`, its finished rows relayed to `progress` and its
    notices logged every 0.5 s while they run; returns the run's summary. A coordinator that
    died and that Ray restarts (`ray.coordinator_restarts`) is waited for (at most `timeout_s`)
    and run again from RUN_DIR's newest checkpoint; the rows it recomputes are not relayed twice."""
    last, begin = start.state.round, start
    while True:
        done = coordinator.run.remote(duty, begin)
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
            log.warning(
                "the coordinator actor died; Ray restarts it, and it resumes from the newest checkpoint in RUN_DIR"
            )
            wait_until_answers(coordinator, timeout_s)
            begin = None


def wait_until_answers(actor: Any, timeout_s: float) -> None:
    """Block until `actor` answers a call again (Ray restarted it); `RuntimeError` after `timeout_s`."""
    started = time.monotonic()
    while True:
        try:
            ray.get(actor.progress.remote(), timeout=max(1.0, timeout_s - (time.monotonic() - started)))
            return
        except (ActorUnavailableError, ray.exceptions.GetTimeoutError):
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(
                    f"the coordinator actor did not come back within ray.actor_timeout_s = {timeout_s:g} s"
                ) from None
            time.sleep(0.5)

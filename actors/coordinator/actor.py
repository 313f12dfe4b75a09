"""The coordinator actor: hosts one federation's round loop on Ray.

It owns the global model, the server policy, the device population, the virtual clock and
the metrics writer (the federation the driver built, read from the object store), and runs the
core's `run_federation` with a `RayExecutor` over the client actors, so its metrics equal the
in-process runner's. It is a threaded actor: `run` drives the rounds while `progress` answers
the driver (`actors/driver/follow.py`). It runs on the head node by default, and Ray restarts it
where it dies anyway; the driver then runs it again from RUN_DIR's newest checkpoint.
"""

from __future__ import annotations

import gc
import threading
from dataclasses import dataclass
from typing import Any, Mapping

import ray

from rayfl import checkpoint, rng
from rayfl.engine import Federation, Start, run_federation, start_of, torch_threads

from ..names import FederationRef
from .dashboard import DashboardMetrics
from .executor import Abandoned, RayExecutor


@dataclass(frozen=True)
class Assignment:
    """What a coordinator host runs: the federation, the client actors, RUN_DIR and the run's key
    (its dashboard series' `run_id` tag)."""

    federation: FederationRef
    clients: list
    run_dir: str
    key: str


def same_run(a: Assignment, b: Assignment) -> bool:
    """Whether two assignments are one run's (its key and its federation in the object store)."""
    return a.key == b.key and a.federation.key() == b.federation.key()


@ray.remote(max_concurrency=3)
class Coordinator:
    """The round loop on Ray, for one run at a time. Its constructor takes nothing (Ray restarts
    it with that, and a pooled host serves one run after another, `reset` between them): each
    `warm` and `run` call brings its run's `Assignment`."""

    series = DashboardMetrics
    """What publishes the round rows (Ray's metrics endpoint)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heard = threading.Condition(self._lock)  # the driver relayed a row, or the run is stopped
        self._running = threading.Lock()  # one run at a time (a driver that lost touch asks again)
        self.stop = threading.Event()
        self.born = rng.global_states()
        self._clear()

    def _clear(self) -> None:
        self.fed: Federation | None = None
        self.assignment: Assignment | None = None
        self.executor: RayExecutor | None = None
        self.metrics: DashboardMetrics | None = None
        self._rows: list[dict[str, Any]] = []
        self._notes: list[str] = []
        self._relayed = 0  # the last round the driver passed to its progress callback

    def _attach(self, assignment: Assignment) -> Federation:
        """The federation and its client actors, once per run. Holding the reference keeps the
        federation (and its dataset) in the object store for as long as the run, which a
        restarting client needs."""
        with self._lock:
            if self.assignment is None or not same_run(self.assignment, assignment):
                fed = ray.get(assignment.federation.ref)
                cfg = fed.config
                self.executor = RayExecutor(
                    assignment.clients,
                    assignment.federation,
                    fed.account,
                    timeout_s=cfg.ray.actor_timeout_s,
                    max_failed_fraction=cfg.federation.max_failed_fraction,
                    report=self._note,
                    stop=self.stop,
                )
                self.fed, self.assignment = fed, assignment
        return self.fed

    def warm(self, assignment: Assignment) -> None:
        """While the client actors warm up: the libraries the round loop writes tables with, the
        global model's measured cost and an evaluation of it (first-call set-up)."""
        import pyarrow.parquet  # noqa: F401  (what `Recorder` writes with)

        from rayfl import metrics  # noqa: F401

        fed = self._attach(assignment)
        with torch_threads():
            fed.cost_of(fed.policy.global_model())
            fed.evaluator(fed.initial_weights(), fed.policy.global_model())

    def run(self, assignment: Assignment, start: Start | None) -> dict[str, Any]:
        """The rounds from `start`; None (a coordinator Ray restarted): from RUN_DIR's newest
        checkpoint, or from round 0 where none was written."""
        fed = self._attach(assignment)
        with self._running:
            if start is not None:  # the driver has passed on the rows up to where it starts the run
                with self._lock:
                    self._relayed = max(self._relayed, start.state.round)
            else:
                start = start_of(fed, assignment.run_dir, resume=checkpoint.exists(assignment.run_dir))
                with self._lock:  # the rows up to the checkpoint, for a driver that had not read them all
                    self._rows += [dict(row) for row in start.recorder.rounds]
            carried = start.recorder.rounds if start.moved else []  # recorded by the driver: published here
            elapsed = start.recorder.rounds[-1]["wall_time_s"] if start.recorder.rounds and not carried else 0.0
            self.metrics = self.series(assignment.key, fed.config.algorithm.name, elapsed)  # the key: runs never mix
            for row in carried:
                self.metrics.record(row, self.executor.alive())
            with torch_threads():
                return run_federation(fed, self.executor, assignment.run_dir, start, self._on_round)

    def _on_round(self, row: Mapping[str, Any]) -> None:
        if self.stop.is_set():
            raise Abandoned(f"the run stopped after round {row['round']}: its driver is gone")
        self.metrics.record(row, self.executor.alive())
        ahead = self.fed.config.ray.rounds_ahead
        with self._lock:
            self._rows.append(dict(row))
            while ahead is not None and row["round"] - self._relayed > ahead and not self.stop.is_set():
                self._heard.wait(timeout=1.0)

    def _note(self, line: str) -> None:
        with self._lock:
            self._notes.append(line)

    def progress(self, relayed: int = 0) -> tuple[list[dict[str, Any]], list[str]]:
        """The round rows finished after round `relayed` (the last the driver has passed on,
        `ray.rounds_ahead`), and the notices (the executor's: actors lost, rounds run again)
        since the last call. A row is kept until the driver says it passed it on: a reply lost on
        the way (`ActorUnavailableError` from a coordinator that lives) loses no row."""
        with self._lock:
            self._relayed = max(self._relayed, relayed)
            self._heard.notify_all()
            self._rows = [row for row in self._rows if row["round"] > self._relayed]
            notes, self._notes = self._notes, []
            return list(self._rows), notes

    def abandon(self, key: str) -> None:
        """Stop the run `key` if it is the one in progress, at its next wait for clients or round
        end (`Abandoned`); a later run that borrowed this host meanwhile is left alone."""
        with self._lock:
            if self.assignment is not None and self.assignment.key == key:
                self.stop.set()
                self._heard.notify_all()

    def reset(self) -> bool:
        """Stop the run in progress, if any, and once it ended forget it (federation, executor,
        rows, the global RNGs' draws) as if just started; returns True."""
        with self._lock:
            self.stop.set()
            self._heard.notify_all()  # a round waiting for the driver
        with self._running, self._lock:
            self._clear()
            rng.restore_global_states(self.born)
            self.stop.clear()
        gc.collect()
        gc.freeze()  # what outlives a run (modules, caches) is not scanned again: the next reset takes milliseconds
        return True

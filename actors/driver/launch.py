"""A run on Ray, from the driver: its cluster joined or started and its actors brought up
(`actors/driver/crew.py`) beside the rounds it may begin in this process (`BringUp`), the run
moved onto them at a round boundary or finished here, followed to the end and its actors given
back, however it ends."""

from __future__ import annotations

import copy
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import ray

from rayfl.config import ConfigError, RunConfig
from rayfl.engine import Federation, Paused, Progress, Start
from rayfl.runner import run_in_process

from ..coordinator.actor import Duty
from ..coordinator.dashboard import DashboardMetrics
from .cluster import check_fits_here, connect
from .crew import Crew, gather, release, wait_for_actors
from .follow import Cancelled, ClusterGone, answer, follow
from .head import HeadStopping

log = logging.getLogger("rayfl")


def launch(
    fed: Federation,
    start: Start,
    run_dir: Path,
    run_id: str,
    address: str | None,
    progress: Progress | None,
    phase: Callable[[str], None],
) -> dict[str, Any]:
    """The rounds of `fed` from `start` on Ray: join the running cluster at `address` (resolved by
    `head.joining` before Ray was imported) or start a local one, gather
    the run's actors and wait until they answer (the federation in the object store once), follow
    the coordinator to the end, give the actors back; the run's summary. Under
    `ray.start_in_process` (`starts_in_process`) the rounds begin in this process meanwhile and
    move onto the actors at the first round boundary after they answer (`hands_over`); a run
    that ends first stops the cluster half started, and one on a local cluster of its own whose
    rounds left take less than its actors' start starts none (`starts_actors`) and publishes its
    rows on the dashboard's series itself. `phase(name)` marks the end of `ray_start`
    (or of the rounds run here, `in_process`), `actors`, `rounds` and `shutdown`."""
    config = fed.config
    running = ray.is_initialized() or bool(address)
    if not running:
        check_fits_here(config)
    up = BringUp(fed, run_dir, run_id, address, pooled=running and config.ray.pool_idle_s > 0, own=not running)
    try:
        if starts_in_process(config, running):
            begun = copy.deepcopy(fed)  # the rounds here change its caches; the actors get it as built
            first = start.state.round + 1
            here = up.begin(start, progress)
            up.start()
            try:
                summary = run_in_process(begun, start, run_dir, here, up.moves)
                up.ended_here()
                phase("in_process")
                return summary
            except Paused as paused:
                start = paused.start
                up.wanted.set()
            except (ConfigError, HeadStopping):
                raise
            except Exception as exc:
                raise RoundsFailed(exc) from exc
            phase("in_process")
            up.done.wait()  # answered already, unless `hands_over` moved before
            up.check()
            here = f"round {first}" if first == start.state.round else f"rounds {first}-{start.state.round}"
            log.info(f"{here} ran in this process while the actors came up; the actors run the rest")
        else:
            up.run(phase)
            up.check()
        phase("actors")
        summary = follow(up.crew.coordinator, up.duty, start, progress, config.ray.actor_timeout_s)
        phase("rounds")
        return summary
    except ClusterGone:
        up.gone = True  # no actor to hand back, no cluster to leave: Ray's calls would wait for its GCS
        raise
    finally:
        up.close()
        phase("shutdown")


class RoundsFailed(Exception):
    """The rounds begun in this process raised (`cause`): the run's own error, as the coordinator's
    would be on Ray."""

    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


def starts_in_process(config: RunConfig, running: bool) -> bool:
    """Whether the run begins in this process (`ray.start_in_process`): under `auto` when it starts
    a local cluster of its own and its actors train on the CPU, as this process does."""
    wanted = config.ray.start_in_process
    return wanted is True or (wanted == "auto" and not running and config.ray.gpus_per_actor == 0)


ACTOR_START_CPU_S = 3.0
"""CPU seconds an actor process takes to start (Python, torch, rayfl imported), measured on the
2-core machine (docs/ray.md, "Rounds begun in the driver")."""


def starts_actors(rounds_left: int, seconds_per_round: float, actors: int, cpus: float) -> bool:
    """Whether a run begun in this process on a local cluster of its own starts its actors once
    Ray is up: only when its rounds left, at this process's pace, outlast its actors' start
    (`actors` client actors and the coordinator importing on the cluster's `cpus` but the one
    this process's rounds take). A run shorter than that would only be slowed down by them (they
    share its cores) and finishes here."""
    return rounds_left * seconds_per_round > ACTOR_START_CPU_S * (actors + 1) / max(1.0, cpus - 1)


def hands_over(round: int, ready: bool) -> bool:
    """Whether a run begun in this process moves onto the actors after `round`: as soon as they
    answer (`ready`). (The tests move at a chosen round instead, waiting there for the actors.)"""
    return ready


class BringUp(threading.Thread):
    """A run's cluster and actors brought up: connected (or a local cluster started), the crew
    gathered, the federation put in the object store once, every actor warmed; in this thread
    (`run`) or beside the rounds that begin in this process (`start`). `close` stops it where it
    is, hands the actors back and leaves the cluster, however the run ended.

    Started beside the rounds, the thread lives until `close`, and leaves the cluster itself: the
    processes of a local cluster that it started end with it (Ray starts them with Linux's
    `PR_SET_PDEATHSIG`, which fires when the thread that started them ends, not the process)."""

    def __init__(self, fed: Federation, run_dir: Path, run_id: str, address: str | None, pooled: bool, own: bool):
        super().__init__(name="rayfl-bring-up", daemon=True)
        self.fed, self.run_dir, self.run_id, self.address, self.pooled = fed, run_dir, run_id, address, pooled
        self.own = own  # a local cluster of the run's own: no actor of it is up yet
        self.connected, self.gone = False, False
        self.stays = False  # the run begun here finishes here: no actor starts (`starts_actors`)
        self.crew: Crew | None = None
        self.duty: Duty | None = None
        self.error: BaseException | None = None
        self.done, self.cancelled, self.leave = threading.Event(), threading.Event(), threading.Event()
        self.wanted = threading.Event()  # the run begun here waits for its actors
        self.rows: list[Mapping[str, Any]] = []  # the rows of the rounds begun here
        self.times: list[float] = []  # when each was passed on
        self.passed = threading.Condition()  # one more was
        self.left = 0  # rounds the run had left when they began here
        self.series: DashboardMetrics | None = None
        self.published, self.wall_time_s = 0, 0.0

    def begin(self, start: Start, progress: Progress | None) -> Progress:
        """The rounds begin in this process from `start`: the progress callback that passes their
        rows on to `progress`, counts them (this process's pace) and, when the run stays here,
        publishes them on the dashboard's series, as the coordinator does for its rounds."""
        self.left = self.fed.config.federation.rounds - start.state.round
        recorded = start.recorder.rounds
        self.wall_time_s = recorded[-1]["wall_time_s"] if recorded else 0.0  # a resumed run's published already

        def seen(row: Mapping[str, Any]) -> None:
            with self.passed:
                self.times.append(time.monotonic())
                self.rows.append(row)
                self.passed.notify_all()
            if self.stays:
                self.publish()
            if progress is not None:
                progress(row)

        return seen

    def publish(self) -> None:
        """The rows not published yet, on the dashboard's series (in the run's thread)."""
        if self.series is None:
            self.series = DashboardMetrics(self.run_id, self.fed.config.algorithm.name, self.wall_time_s)
        for row in self.rows[self.published :]:
            self.series.record(row, 0)
        self.published = len(self.rows)

    def moves(self, round: int) -> bool:
        """Whether the run begun here moves onto the actors after `round` (`hands_over`): not when
        it stays; when they answer (or the bring-up failed)."""
        return not self.stays and hands_over(round, self.done.is_set())

    def ended_here(self) -> None:
        """The rounds begun here ended the run: once whether it stays is decided (on its own
        cluster; `close` waits for Ray's start anyway), the rows not published yet are."""
        if self.own:
            self.done.wait()
        if self.stays:
            self.publish()  # those before the decision (after the last round, say)

    def _stays(self) -> bool:
        """Whether the run begun here finishes here (`starts_actors`), decided once Ray is up from
        the pace of the first round this process began after that (the rounds during Ray's start
        run at half the pace or less, measured); the actors start sooner when the round going on
        has run long enough since Ray came up to say so. Logs why the run stays."""
        whole = ray.cluster_resources()  # the run's own: all of it free for its actors
        actors, cpus = self.fed.config.resources.count(whole), whole.get("CPU", 1.0)
        up = time.monotonic()
        timed = len(self.rows) + 2  # the round going on now, then one begun with Ray up
        with self.passed:
            while len(self.rows) < min(timed, self.left):
                if self.wanted.is_set():  # moved all the same (the tests move at a round of their choice)
                    return False
                going = time.monotonic() - max(up, self.times[-1] if self.times else up)  # at least its pace
                if starts_actors(self.left - len(self.rows) - 1, going, actors, cpus):
                    return False
                if self.cancelled.is_set():
                    raise Cancelled()
                self.passed.wait(0.05)
        if timed >= self.left:
            return True  # the rounds are over before one was timed: the run ends here
        left, pace = self.left - timed, self.times[timed - 1] - self.times[timed - 2]
        if starts_actors(left, pace, actors, cpus):
            return False
        log.info(
            f"the run finishes in this process: its {left} rounds left take about {left * pace:.0f} s here, less "
            "than its actors' start"
        )
        return True

    def run(self, phase: Callable[[str], None] = lambda name: None) -> None:
        config = self.fed.config
        try:
            self.connected = connect(self.address, config.ray.dashboard)
            phase("ray_start")
            self._cancelled()
            self.stays = self.own and threading.current_thread() is self and self._stays()  # beside the rounds
            if not self.stays:
                self.crew = gather(config, self.run_id, self.pooled)
                self._cancelled()
                self.duty = Duty([ray.put(self.fed)], self.crew.clients, str(self.run_dir), self.crew.key)
                coordinator_ready = self.crew.coordinator.warm.remote(self.duty)
                wait_for_actors(
                    self.crew.clients,
                    config.ray.actor_timeout_s,
                    log.info,
                    federation_ref=self.duty.federation_box[0],
                    stop=self.cancelled,
                )
                answer(coordinator_ready, every_s=0.5, stop=self.cancelled)
        except BaseException as exc:  # raised in the run's thread by `check`
            self.error = exc
        finally:
            self.done.set()
        if threading.current_thread() is self:
            self.leave.wait()
            self._leave_cluster()

    def _cancelled(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled()

    def check(self) -> None:
        """Raise what stopped the bring-up, if anything did."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.cancelled.set()
        beside = self.ident is not None  # started as a thread
        try:
            if beside:
                self.done.wait()  # Ray's start is not interrupted: a local cluster half started is left whole
            self.gone = self.gone or isinstance(self.error, ClusterGone)
            if self.crew is not None and not self.gone:
                release(self.crew, self.fed.config.ray.actor_timeout_s)
        finally:  # the cluster is left whatever happened above (a second Ctrl-C included)
            self.leave.set()
            if beside:
                self.join()
            else:
                self._leave_cluster()

    def _leave_cluster(self) -> None:
        if self.connected and not self.gone:
            ray.shutdown()

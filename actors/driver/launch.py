"""A run on Ray, from the driver: its cluster joined or started and its actors brought up
(`actors/driver/crew.py`) beside the rounds it may begin in this process (`BringUp`), the run
moved onto them at a round boundary or finished here, followed to the end and its actors given
back, however it ends."""

from __future__ import annotations

import copy
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import psutil
import ray

from rayfl.config import ConfigError, RunConfig
from rayfl.engine import Federation, Paused, Progress, Start
from rayfl.runner import run_in_process

from ..coordinator.actor import Duty
from .cluster import check_fits_here, connect, here
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
    that ends first stops the cluster half started, and one that would start a local cluster of
    its own starts it only when the actors are expected to finish the rounds left sooner
    (`outlook`), else it finishes here without Ray. `phase(name)` marks the end of `ray_start`
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
RAY_START_CPU_S = 5.0
"""CPU seconds a run's own local cluster takes to come up: Ray's import, its GCS, raylet,
dashboard and agents (5-6 CPU seconds measured on the 2-core machine, 2026-11-28)."""
ACTOR_ROUND_OVERHEAD = 0.2
"""How much longer a round takes on the actors than the driver's pace split over them: the
coordinator's calls and the sums' way back (the default run's 2 actors ran a round in 1.0 s
against 1.7 s in the driver on 2 quiet cores; docs/ray.md)."""
TIMED_ROUND_S = 2.0
"""A first round at least this long is the pace; a shorter one may be mostly its one-time costs
(the first batches, the model's first use), and the second round is timed instead."""


@dataclass(frozen=True)
class Outlook:
    """Where a run begun in this process on a local cluster of its own is expected to finish its
    `rounds_left` sooner (`outlook`): here, in `here_s` seconds, or on `actors` client actors in
    `actors_s` seconds, their start included, with `free_cpus` of the machine's `cpus` free of
    other work."""

    rounds_left: int
    here_s: float
    actors_s: float
    actors: int
    free_cpus: float
    cpus: float

    @property
    def moves(self) -> bool:
        return self.actors_s < self.here_s

    def line(self) -> str:
        """The one line that says which was chosen and why."""
        why = (
            f"its {self.rounds_left} rounds left take about {self.here_s:.0f} s here, about {self.actors_s:.0f} s "
            f"on {self.actors} actors with their start ({self.free_cpus:.1f} of {self.cpus:g} cores free of other work)"
        )
        if self.moves:
            return f"the run moves onto its actors once they are up: {why}"
        return f"the run finishes in this process, no Ray cluster started: {why}"


def outlook(rounds_left: int, seconds_per_round: float, actors: int, free_cpus: float, cpus: float) -> Outlook:
    """A run's `Outlook` from the driver's pace and the cores free of other work (both measured
    over the same round). The start (Ray's, then the coordinator's and each client actor's) runs
    on the free cores but the one the driver's rounds take (half of one when there are none), the
    rounds going on meanwhile; then each round takes the driver's pace split over as many actors as
    free cores hold, `ACTOR_ROUND_OVERHEAD` more. With one core free or none, the actors never run
    a round faster than the driver, and the run stays here."""
    start = (RAY_START_CPU_S + ACTOR_START_CPU_S * (actors + 1)) / max(free_cpus - 1.0, 0.5)
    each = seconds_per_round * (1.0 + ACTOR_ROUND_OVERHEAD) / max(1.0, min(actors, free_cpus))
    after = max(0.0, rounds_left - start / seconds_per_round)  # the rounds left once the actors answer
    return Outlook(rounds_left, rounds_left * seconds_per_round, start + after * each, actors, free_cpus, cpus)


def busy_seconds() -> tuple[float, float]:
    """(CPU seconds every core has been busy since boot, of them this process's): their change
    over a round is the load of other work during it."""
    machine, mine = psutil.cpu_times(), psutil.Process().cpu_times()
    return sum(machine) - machine.idle - getattr(machine, "iowait", 0.0), mine.user + mine.system


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
        self.stays = False  # the run begun here finishes here: Ray never starts (`outlook`)
        self.crew: Crew | None = None
        self.duty: Duty | None = None
        self.error: BaseException | None = None
        self.done, self.cancelled, self.leave = threading.Event(), threading.Event(), threading.Event()
        self.wanted = threading.Event()  # the run begun here waits for its actors
        self.rounds: list[tuple[float, tuple[float, float]]] = []  # when each round begun here ended, `busy_seconds`
        self.passed = threading.Condition()  # one more did
        self.left = 0  # rounds the run had left when they began here

    def begin(self, start: Start, progress: Progress | None) -> Progress:
        """The rounds begin in this process from `start`: the progress callback that passes their
        rows on to `progress` and times them (this process's pace, the load of other work)."""
        self.left = self.fed.config.federation.rounds - start.state.round
        self.rounds.append((time.monotonic(), busy_seconds()))  # the first begins now

        def seen(row: Mapping[str, Any]) -> None:
            with self.passed:
                if len(self.rounds) < 3:  # the decision times round 1 or 2 at most: no reads after
                    self.rounds.append((time.monotonic(), busy_seconds()))
                self.passed.notify_all()
            if progress is not None:
                progress(row)

        return seen

    def moves(self, round: int) -> bool:
        """Whether the run begun here moves onto the actors after `round` (`hands_over`): not when
        it stays; when they answer (or the bring-up failed)."""
        return not self.stays and hands_over(round, self.done.is_set())

    def ended_here(self) -> None:
        """The rounds begun here ended the run: once whether it stays is decided (on its own
        cluster; `close` waits for Ray's start anyway)."""
        if self.own:
            self.done.wait()

    def _stays(self) -> bool:
        """Whether the run begun here finishes here, decided before Ray starts (`outlook`) on the
        first round, or the second when the first took less than `TIMED_ROUND_S`; logs which and
        why. A run whose rounds end before that stays (and says nothing)."""
        with self.passed:
            while True:
                if self.wanted.is_set():  # moved all the same (the tests move at a round of their choice)
                    return False
                if self.cancelled.is_set():
                    raise Cancelled()
                ended = len(self.rounds) - 1
                if ended >= self.left:
                    return True
                if ended == 2 or ended == 1 and self.rounds[1][0] - self.rounds[0][0] >= TIMED_ROUND_S:
                    break
                self.passed.wait(0.05)
        (began, (busy0, mine0)), (now, (busy1, mine1)) = self.rounds[ended - 1], self.rounds[ended]
        pace = max(now - began, 1e-6)
        machine = here()
        cpus = machine["CPU"]
        free = min(cpus, max(0.0, cpus - (busy1 - busy0 - (mine1 - mine0)) / pace))
        seen = outlook(self.left - ended, pace, self.fed.config.resources.count(machine), free, cpus)
        log.info(seen.line())
        return not seen.moves

    def run(self, phase: Callable[[str], None] = lambda name: None) -> None:
        config = self.fed.config
        try:
            self.stays = self.own and threading.current_thread() is self and self._stays()  # beside the rounds
            if not self.stays:
                self.connected = connect(self.address, config.ray.dashboard)
                phase("ray_start")
                self._cancelled()
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

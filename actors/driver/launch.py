"""A run on Ray, from the driver: its cluster joined or started and its actors brought up
(`bring_up`, `actors/driver/crew.py`), here or beside the rounds it may begin in this process
(`actors/driver/handover.py`), the run moved onto them at a round boundary or finished here,
followed to the end and its actors given back, however it ends."""

from __future__ import annotations

import copy
import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ray

from rayfl.config import ConfigError, RunConfig
from rayfl.engine import Federation, Paused, Progress, Start
from rayfl.runner import run_in_process

from ..coordinator.actor import Assignment
from ..names import FederationRef
from .cluster import check_fits_here, connect
from .crew import RunActors, assemble, release, wait_for_actors
from .follow import Cancelled, ClusterGone, answer, follow
from .handover import HandOver, RoundClock, Rule
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
    rule: Rule | None = None,
) -> dict[str, Any]:
    """The rounds of `fed` from `start` on Ray: join the running cluster at `address` (resolved by
    `head.joining` before Ray was imported) or start a local one, bring up the run's actors
    (`bring_up`: the federation in the object store once), follow the coordinator to the end, give
    the actors back; the run's summary. Under `ray.start_in_process` (`starts_in_process`) the
    rounds begin in this process meanwhile and move onto the actors at a round boundary that
    `rule` chooses (default `Rule()`: the first after they answer, and on a local cluster of the
    run's own only when they are expected to finish the rounds left sooner, else the run finishes
    here without Ray). `phase(name)` marks the end of `ray_start` (or of the rounds run here,
    `in_process`), `actors`, `rounds` and `shutdown`."""
    config = fed.config
    running = ray.is_initialized() or bool(address)
    if not running:
        check_fits_here(config)
    brought = Brought()
    bring = functools.partial(bring_up, brought, fed, run_dir, run_id, address, running and config.ray.pool_idle_s > 0)
    over: HandOver | None = None
    try:
        if starts_in_process(config, running):
            rule = rule or Rule()
            begun = copy.deepcopy(fed)  # the rounds here change its caches; the actors get it as built
            left = config.federation.rounds - start.state.round
            clock = RoundClock(rule, left, config.resources) if rule.paced(not running) else None
            over = HandOver(rule, clock, bring, functools.partial(leave_cluster, brought))
            over.start()
            ended = rounds_here(
                begun, start, run_dir, progress if clock is None else clock.timed(progress), over, phase
            )
            if not isinstance(ended, Start):
                return ended
            start = ended
        else:
            bring(threading.Event(), phase)
        phase("actors")
        summary = follow(brought.crew.coordinator, brought.assignment, start, progress, config.ray.actor_timeout_s)
        phase("rounds")
        return summary
    except ClusterGone:
        brought.gone = True
        raise
    finally:
        try:
            if over is not None:
                over.stop()
            if brought.crew is not None and not brought.gone:
                release(brought.crew, config.ray.actor_timeout_s)
        finally:  # the cluster is left whatever happened above (a second Ctrl-C included)
            over.close() if over is not None else leave_cluster(brought)
            phase("shutdown")


def rounds_here(
    fed: Federation,
    start: Start,
    run_dir: Path,
    progress: Progress | None,
    over: HandOver,
    phase: Callable[[str], None],
) -> dict[str, Any] | Start:
    """The rounds begun in this process from `start` until the run ends (its summary) or moves
    (`over.moves`): then, once the actors answer, the start they continue from."""
    first = start.state.round + 1
    try:
        summary = run_in_process(fed, start, run_dir, progress, over.moves)
        phase("in_process")
        return summary
    except Paused as paused:
        start = paused.start
    except (ConfigError, HeadStopping):
        raise
    except Exception as exc:
        raise RoundsFailed(exc) from exc
    phase("in_process")
    over.take()
    here = f"round {first}" if first == start.state.round else f"rounds {first}-{start.state.round}"
    log.info(f"{here} ran in this process while the actors came up; the actors run the rest")
    return start


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


@dataclass
class Brought:
    """What `bring_up` brought up so far, for the run's end to undo: whether this process
    connected to Ray (and disconnects), the run's actors, their assignment; `gone` once the cluster is lost (no
    actor to hand back, no cluster to leave: Ray's calls would wait for its GCS)."""

    connected: bool = False
    crew: RunActors | None = None
    assignment: Assignment | None = None
    gone: bool = False


def bring_up(
    brought: Brought,
    fed: Federation,
    run_dir: Path,
    run_id: str,
    address: str | None,
    pooled: bool,
    cancelled: threading.Event,
    phase: Callable[[str], None] = lambda name: None,
) -> None:
    """The run's cluster and actors, into `brought` step by step: connected (or a local cluster
    started: `ray_start`), the crew gathered (`pooled`: borrowed from the warm pool), the
    federation put in the object store once, every actor warmed. `Cancelled` once `cancelled` is
    set, between the steps (Ray's start is not interrupted)."""
    config = fed.config
    try:
        stop_if(cancelled)  # the run ended before Ray was needed
        brought.connected = connect(address, config.ray.dashboard)
        phase("ray_start")
        stop_if(cancelled)
        crew = brought.crew = assemble(config, run_id, pooled)
        stop_if(cancelled)
        assignment = brought.assignment = Assignment(FederationRef(ray.put(fed)), crew.clients, str(run_dir), crew.key)
        coordinator_ready = crew.coordinator.warm.remote(assignment)
        timeout_s = config.ray.actor_timeout_s
        wait_for_actors(crew.clients, timeout_s, log.info, federation=assignment.federation, stop=cancelled)
        answer(coordinator_ready, every_s=0.5, stop=cancelled)
    except ClusterGone:
        brought.gone = True
        raise


def stop_if(cancelled: threading.Event) -> None:
    if cancelled.is_set():
        raise Cancelled()


def leave_cluster(brought: Brought) -> None:
    """Disconnect from Ray if this run connected (a local cluster of its own stops), unless the
    cluster is gone."""
    if brought.connected and not brought.gone:
        ray.shutdown()

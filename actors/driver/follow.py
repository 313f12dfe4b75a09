"""Following a run from the driver: the coordinator's round rows relayed to the progress bar and
its notices logged as they come, and a coordinator that Ray restarts waited for and run again
from RUN_DIR's newest checkpoint."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from rayfl.engine import Progress, Start

from .. import raystate
from ..coordinator.actor import Assignment
from . import head

log = logging.getLogger("rayfl")


def follow(
    coordinator: Any, assignment: Assignment, start: Start, progress: Progress | None, timeout_s: float
) -> dict[str, Any]:
    """The coordinator's rounds from `start`, its finished rows relayed to `progress` and its
    notices logged every 0.5 s while they run; returns the run's summary. A coordinator that
    died and that Ray restarts (`ray.coordinator_restarts`) is waited for (at most `timeout_s`)
    and run again from RUN_DIR's newest checkpoint; the rows it recomputes are not relayed twice.
    `ClusterGone` when the coordinator is lost with the cluster itself (`rayfl down` mid-run).
    Only the coordinator's own calls are read for its restart (`heard`)."""
    last, begin = start.state.round, start
    while True:
        done = coordinator.run.remote(assignment, begin)
        while (news := heard(coordinator, done, last, timeout_s)) is not None:
            if head.STOPPING.is_set():  # `rayfl down` waits for this run to hand its actors back
                raise head.HeadStopping()
            finished, rows, notes = news
            for note in notes:
                log.warning(note)
            for row in rows:
                if row["round"] > last and progress is not None:
                    relay(progress, row)
                last = max(last, row["round"])
            if finished:
                return ray.get(done)  # the summary, or the run's own error once its last rows and notices are out
        begin = None


def heard(
    coordinator: Any, done: ray.ObjectRef, last: int, timeout_s: float
) -> tuple[bool, list[dict[str, Any]], list[str]] | None:
    """Within 0.5 s, what the coordinator's run `done` has to say: whether it ended, and the rows
    after round `last` (the one the driver relayed last) and the notices since the last call.
    None when Ray is restarting the coordinator (one that died for good raises
    `ActorDiedError`), after waiting until it answers again."""
    try:
        finished = bool(ray.wait([done], timeout=0.5)[0])
        rows, notes = answer(coordinator.progress.remote(last))
        if finished:
            try:
                ray.get(done)
            except ActorUnavailableError:
                raise
            except Exception:  # the run's own error: `follow` raises it once these rows and notices are out
                pass
        return finished, rows, notes
    except ActorUnavailableError:
        if raystate.cluster_gone():
            raise ClusterGone() from None
        log.warning("the coordinator actor died; Ray restarts it, and it resumes from the newest checkpoint in RUN_DIR")
        wait_until_answers(coordinator, timeout_s)
        return None


def relay(progress: Progress, row: dict[str, Any]) -> None:
    """`progress(row)`; an actor of its own that it found dead or restarting is its error, never
    read as the coordinator's (`RuntimeError`)."""
    try:
        progress(row)
    except RayActorError as exc:
        raise RuntimeError(f"the progress callback failed: {exc}") from exc


def answer(ref: ray.ObjectRef, every_s: float = 2.0, stop: threading.Event | None = None) -> Any:
    """The value of `ref`, asking every `every_s` seconds while it is pending whether the cluster
    is still there (`ClusterGone` when not): a call to an actor of a cluster whose head stopped
    waits for Ray's GCS reconnection (a minute), after which Ray ends the process without a word.
    `Cancelled` once `stop` is set."""
    while not ray.wait([ref], timeout=every_s)[0]:
        if stop is not None and stop.is_set():
            raise Cancelled()
        if raystate.cluster_gone():
            raise ClusterGone() from None
    return ray.get(ref)


class Cancelled(Exception):
    """The bring-up was stopped: the run ended before it needed the actors."""


def wait_until_answers(actor: Any, timeout_s: float) -> None:
    """Block until `actor` answers a call again (Ray restarted it); `RuntimeError` after `timeout_s`."""
    started = time.monotonic()
    while True:
        try:
            ray.get(actor.progress.remote(), timeout=max(1.0, timeout_s - (time.monotonic() - started)))
            return
        except (ActorUnavailableError, ray.exceptions.GetTimeoutError):
            if raystate.cluster_gone():
                raise ClusterGone() from None
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(
                    f"the coordinator actor did not come back within ray.actor_timeout_s = {timeout_s:g} s"
                ) from None
            time.sleep(0.5)


class ClusterGone(RuntimeError):
    """The cluster stopped under a run (its head's GCS port no longer takes connections,
    `raystate.cluster_gone`): nothing of it is left to hand back, and the run continues from
    RUN_DIR with `--resume`."""

    def __init__(self) -> None:
        super().__init__("the cluster stopped under the run (its head no longer answers)")

"""The rounds a run begins in the driver's process while its actors come up
(`ray.start_in_process`), and the hand-over onto the actors at a round boundary: the rule that
says when (`Rule`), the decision whether the actors start at all, from the driver's pace
(`RoundClock`, `outlook`), and the thread that brings them up meanwhile (`HandOver`)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import psutil

from rayfl.config import Resources
from rayfl.engine import Progress

from .cluster import here
from .follow import Cancelled

log = logging.getLogger("rayfl")

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


class Rule:
    """When a run begun in this process moves onto its actors (`launch`'s `rule`; `rayfl.api.run`'s
    `hand_over`). This one, the default: on a local cluster of its own (`paced`) the actors start
    only when they are expected to finish the rounds left sooner (`outlook`, from the driver's pace
    over a round of at least `timed_round_s`: `RoundClock`); the run moves after the first round
    that ends once they answer (`moves`). A rule that moves at a round of its choice makes the
    rounds begun here wait there for the actors."""

    timed_round_s = TIMED_ROUND_S

    def paced(self, own: bool) -> bool:
        """Whether the driver's pace decides first if the actors start at all: when the run
        starts a local cluster of its own (`own`), whose start is the cost; a running cluster's
        actors answer at once."""
        return own

    def outlook(
        self, rounds_left: int, seconds_per_round: float, actors: int, free_cpus: float, cpus: float
    ) -> Outlook:
        return outlook(rounds_left, seconds_per_round, actors, free_cpus, cpus)

    def moves(self, round: int, ready: bool) -> bool:
        """Whether the run moves after `round`: as soon as the actors answer (`ready`)."""
        return ready


class RoundClock:
    """When each round begun in this process ended, with `busy_seconds`, until the pace is timed:
    round 1, or round 2 when round 1 took less than the rule's `timed_round_s`. `stays` decides
    from it, before Ray starts, whether the run finishes here."""

    def __init__(self, rule: Rule, rounds_left: int, resources: Resources):
        self.rule, self.rounds_left, self.resources = rule, rounds_left, resources
        self.ends = [(time.monotonic(), busy_seconds())]  # the first round begins now
        self.ended = threading.Condition()  # one more did
        self.wanted = threading.Event()  # the rule moved: the actors start whatever the pace

    def timed(self, progress: Progress | None) -> Progress:
        """The progress callback of the rounds begun here: their rows passed on to `progress`."""

        def seen(row: Mapping[str, Any]) -> None:
            with self.ended:
                if len(self.ends) < 3:  # the decision times round 1 or 2 at most: no reads after
                    self.ends.append((time.monotonic(), busy_seconds()))
                self.ended.notify_all()
            if progress is not None:
                progress(row)

        return seen

    def stays(self, cancelled: threading.Event) -> bool:
        """Whether the run finishes here (`Rule.outlook`; logs which and why), once the pace is
        timed. A run whose rounds end before that stays (and says nothing); `Cancelled` once
        `cancelled` is set before either (a run that ends here cancels only after its rounds)."""
        with self.ended:
            while True:
                if self.wanted.is_set():
                    return False
                ended = len(self.ends) - 1
                if ended >= self.rounds_left:
                    return True
                if ended == 2 or ended == 1 and self.ends[1][0] - self.ends[0][0] >= self.rule.timed_round_s:
                    break
                if cancelled.is_set():
                    raise Cancelled()
                self.ended.wait(0.05)
        (began, (busy0, mine0)), (now, (busy1, mine1)) = self.ends[ended - 1], self.ends[ended]
        pace = max(now - began, 1e-6)
        machine = here()
        cpus = machine["CPU"]
        free = min(cpus, max(0.0, cpus - (busy1 - busy0 - (mine1 - mine0)) / pace))
        seen = self.rule.outlook(self.rounds_left - ended, pace, self.resources.count(machine), free, cpus)
        log.info(seen.line())
        return not seen.moves


class HandOver:
    """The actors brought up (`bring`) in a thread beside the rounds begun in this process, and
    the run moved onto them at a round boundary (`moves`, by the `rule`) or finished here. With a
    `clock`, the thread first decides from the driver's pace whether they start at all.

    The thread lives until `close` and leaves the cluster itself (`leave`): the processes of a
    local cluster that it started end with it (Ray starts them with Linux's `PR_SET_PDEATHSIG`,
    which fires when the thread that started them ends, not the process)."""

    def __init__(
        self,
        rule: Rule,
        clock: RoundClock | None,
        bring: Callable[[threading.Event], None],
        leave: Callable[[], None],
    ):
        self.rule, self.clock = rule, clock
        self.stays = False  # the run begun here finishes here: Ray never starts
        self.error: BaseException | None = None
        self.ready, self.cancelled, self.left = threading.Event(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._bring, args=(bring, leave), name="rayfl-bring-up", daemon=True)

    def start(self) -> None:
        """The bring-up begins beside the rounds (once the run holds this object: `close` ends it)."""
        self.thread.start()

    def _bring(self, bring: Callable[[threading.Event], None], leave: Callable[[], None]) -> None:
        try:
            self.stays = self.clock is not None and self.clock.stays(self.cancelled)
            if not self.stays:
                bring(self.cancelled)
        except BaseException as exc:  # raised in the run's thread by `take`
            self.error = exc
        finally:
            self.ready.set()
        self.left.wait()
        leave()

    def moves(self, round: int) -> bool:
        """Whether the rounds begun here stop after `round` for the actors: never once the run
        stays; else the rule's answer, told whether the actors answer (or the bring-up failed)."""
        return not self.stays and self.rule.moves(round, self.ready.is_set())

    def take(self) -> None:
        """The run moves: wait until the actors answer (their start decided now if the pace was
        not yet timed); raise what stopped the bring-up, if anything did."""
        if self.clock is not None:
            self.clock.wanted.set()
        self.ready.wait()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """The bring-up stopped where it is, once Ray's start is over: a local cluster half
        started is left whole, for `close`."""
        self.cancelled.set()
        self.ready.wait()

    def close(self) -> None:
        """The cluster left, by the thread that joined it."""
        self.left.set()
        self.thread.join()

"""`rayfl run` with a local cluster of its own, begun in process (`ray.start_in_process: auto`),
interrupted by a Ctrl-C (a SIGINT to itself) in one phase: `python -m
tests.actors.interrupt_drill PHASE RUN_DIR` (exit code and lines: `rayfl run`'s).

- `starting`: at round 1's row, run in this process, once the bring-up has called `connect`
  (Ray's start under way: it takes seconds).
- `moving`: during the hand-over after round 2, as the driver takes the bring-up's result.
- `moved`: at round 3's row, relayed from the coordinator.
"""

import functools
import os
import signal
import sys
import threading

from actors.driver import follow, handover, launch
from rayfl import api, cli
from tests.actors.drills import AHEAD

SETS = ["federation.rounds=5", "federation.checkpoint_every=1", "model.name=mlp", "ray.num_actors=1", AHEAD]


def interrupt() -> None:
    os.kill(os.getpid(), signal.SIGINT)


class Drill(handover.Rule):
    """Ray and the actors start after round 1, though a run this short would finish here; the run
    moves after round 2 (waiting there for the actors), or when they answer (`starting`: never
    before the Ctrl-C)."""

    timed_round_s = 0.0

    def __init__(self, phase: str):
        self.phase = phase

    def outlook(self, *args):
        return handover.Outlook(4, 1.0, 0.0, 1, 2.0, 2.0)

    def moves(self, round: int, ready: bool) -> bool:
        return ready if self.phase == "starting" else round == 2


def main(phase: str, run_dir: str) -> int:
    starting = threading.Event()
    connect, run_in_process, take, relay = launch.connect, launch.run_in_process, handover.HandOver.take, follow.relay

    def connecting(*args, **kwargs):  # in the bring-up's thread
        starting.set()
        return connect(*args, **kwargs)

    def interrupted_at_round_one(fed, start, run_dir, progress, pause):
        def progress_then_interrupt(row):
            progress(row)
            if row["round"] == 1 and starting.wait(60):
                interrupt()

        return run_in_process(fed, start, run_dir, progress_then_interrupt, pause)

    def interrupted_take(self):  # once the actors answer, as the driver takes them
        self.ready.wait()
        interrupt()
        take(self)

    def relay_then_interrupt(progress, row):
        relay(progress, row)
        if row["round"] == 3:
            interrupt()

    launch.connect = connecting
    api.run = functools.partial(api.run, hand_over=Drill(phase))
    if phase == "starting":
        launch.run_in_process = interrupted_at_round_one
    if phase == "moving":
        handover.HandOver.take = interrupted_take
    if phase == "moved":
        follow.relay = relay_then_interrupt
    return cli.main(["run", "--out", run_dir, *(a for s in SETS for a in ("--set", s))])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

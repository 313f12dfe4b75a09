"""The engine: a federation built once (`federation`), the round (`round`), what decides what
happens next on the virtual clock (`scheduler`), the run from start to end (`loop`), and what
runs where the clients train (`host`). The in-process runner (`rayfl.runner`) and the Ray
hosts (`actors/`) host it side by side; it never imports either (`docs/design.md`).
"""

from .federation import Federation, build_federation
from .host import ClientRunner, GroupOutcome, run_group, torch_threads
from .loop import Paused, Progress, Start, new_run_dir, prepare, run_federation, start_of
from .round import Executor, HoldSeconds, run_round
from .scheduler import SCHEDULERS, Scheduler, Synchronous

__all__ = [
    "SCHEDULERS",
    "ClientRunner",
    "Executor",
    "Federation",
    "GroupOutcome",
    "HoldSeconds",
    "Paused",
    "Progress",
    "Scheduler",
    "Start",
    "Synchronous",
    "build_federation",
    "new_run_dir",
    "prepare",
    "run_federation",
    "start_of",
    "run_group",
    "run_round",
    "torch_threads",
]

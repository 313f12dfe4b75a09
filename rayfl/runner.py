"""The in-process executor and runner: the reference the Ray runner must match exactly.

`run_local` builds the federation and runs the engine's loop (`rayfl.engine.run_federation`)
with an `InProcessExecutor`: the same `ClientRunner` the Ray client actors host, one group
after another in this process.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .algorithms.exchange import LocalRelay, RoundDriver, SessionFailed, client_side
from .algorithms.messages import ClientFailure, ClientResult, ClientTask
from .config import RunConfig
from .engine import (
    ClientRunner,
    Federation,
    GroupOutcome,
    HoldSeconds,
    Progress,
    Start,
    new_run_dir,
    prepare,
    run_federation,
    run_group,
    torch_threads,
)
from .engine.host import exchange_failed


class InProcessExecutor:
    """Runs groups one after another in this process, with the same `ClientRunner` actors host."""

    def __init__(self, fed: Federation):
        self.runner = ClientRunner.of(fed)
        self.account = fed.account

    def submit(
        self, groups: Sequence[Sequence[ClientTask]], *, sums: bool, hold_s: HoldSeconds | None = None
    ) -> Callable[[], list[GroupOutcome]]:
        def collect() -> list[GroupOutcome]:
            out = []
            for group in groups:
                start = time.perf_counter()
                out.append(run_group(self.runner, self.account, group, sums))
                if hold_s is not None:
                    time.sleep(max(0.0, hold_s(out[-1]) - (time.perf_counter() - start)))
            return out

        return collect

    def exchange(self, tasks: Sequence[ClientTask], driver: RoundDriver) -> list[ClientResult | ClientFailure]:
        """The round's sessions in this process; an error in a session fails every session of
        the round (as a failed or dying actor does on Ray); an error of the driver ends the run
        (as it does on Ray, where the driver runs in the coordinator)."""
        try:
            sessions = [client_side(self.runner.open_session, t) for t in tasks]
            driver.drive(LocalRelay(sessions))
            return [client_side(s.close) for s in sessions]
        except SessionFailed as exc:
            return exchange_failed(tasks, str(exc))


def run_local(
    config: RunConfig, run_dir: str | Path | None = None, progress: Progress | None = None, resume: bool = False
) -> dict[str, Any]:
    """The whole federation in this process, sequentially (tests, debugging, the reference).
    With `resume`, RUN_DIR continues from its newest intact checkpoint."""
    run_dir = run_dir or new_run_dir(config)
    fed, start = prepare(config, run_dir, resume)
    return run_in_process(fed, start, run_dir, progress)


def run_in_process(
    fed: Federation,
    start: Start,
    run_dir: str | Path,
    progress: Progress | None = None,
    pause: Callable[[int], bool] | None = None,
) -> dict[str, Any]:
    """The rounds of a built federation from `start` in this process; `pause`: `run_federation`'s
    (a run that the driver begins while its actors come up, `actors/driver/launch.py`)."""
    with torch_threads():
        return run_federation(fed, InProcessExecutor(fed), run_dir, start, progress, pause)

"""Running a federation: the round loop over an executor, and the in-process runner.

`run_federation` is the one driver of rounds; the in-process runner gives it a sequential
executor in this process, the Ray coordinator gives it client actors. The in-process runner
is the reference the Ray runner must match exactly.
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from . import checkpoint
from .algorithms.base import ClientFailure, ClientResult, ClientTask
from .algorithms.exchange import LocalRelay, RoundDriver
from .client import TORCH_THREADS, ClientRunner
from .config import RunConfig, dump_config
from .engine import Executor, Federation, Pace, build_federation, run_round
from .metrics import Recorder

Progress = Callable[[Mapping[str, Any]], None]


@contextlib.contextmanager
def torch_threads(n: int = TORCH_THREADS) -> Iterator[None]:
    """Pin torch's intra-op threads for the block (results then match across hosts)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def new_run_dir(config: RunConfig, root: str | Path = "runs") -> Path:
    """runs/<time>-<algorithm>-<dataset>, unique."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{stamp}-{config.algorithm.name}-{config.data.name}"
    path, k = base, 1
    while path.exists():
        path, k = Path(f"{base}-{k}"), k + 1
    return path


def run_federation(
    fed: Federation, executor: Executor, run_dir: str | Path, progress: Progress | None = None, resume: bool = False
) -> dict[str, Any]:
    """All rounds of one federation; writes RUN_DIR as it goes and returns the summary.

    With `resume`, it continues from RUN_DIR's newest checkpoint: rows recorded after that
    round are dropped and recomputed (identically, since every draw is keyed by round).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(fed.config, run_dir / "config.yaml")
    if resume:
        state, virtual_time = checkpoint.latest(run_dir)
        recorder = Recorder.reopen(run_dir, state.round)
        elapsed = recorder.rounds[-1]["wall_time_s"] if recorder.rounds else 0.0
    else:
        state, virtual_time, elapsed = fed.policy.init_state(fed.initial_weights()), 0.0, 0.0
        recorder = Recorder(run_dir)
    fed_cfg = fed.config.federation
    start = time.perf_counter() - elapsed
    for rnd in range(state.round + 1, fed_cfg.rounds + 1):
        out = run_round(fed, state, rnd, executor, virtual_time)
        state, virtual_time = out.state, out.row["virtual_time_s"]
        row = {**out.row, "wall_time_s": time.perf_counter() - start}
        recorder.record(row, out.clients)
        if fed_cfg.checkpoint_every and (rnd % fed_cfg.checkpoint_every == 0 or rnd == fed_cfg.rounds):
            checkpoint.save(run_dir, state, virtual_time)
        if progress is not None:
            progress(row)
    cost = fed.cost_of(fed.policy.global_model())
    extra = {
        "dataset": fed.config.data.name,
        "num_clients": fed.config.data.num_clients,
        "seed": fed.config.seed,
        "model_params": cost.num_params,
        "model_train_flops_per_sample": cost.train_flops,
        **fed.policy.summary(),
    }
    return recorder.summary(fed.config.algorithm.name, extra, fed_cfg.target_accuracy)


class InProcessExecutor:
    """Runs tasks one after another in this process, with the same `ClientRunner` actors host."""

    def __init__(self, fed: Federation):
        self.runner = ClientRunner.of(fed)

    def run(self, tasks: Sequence[ClientTask], pace: Pace | None = None) -> list[ClientResult | ClientFailure]:
        out = []
        for task in tasks:
            start = time.perf_counter()
            result = self.runner.run(task)
            if pace is not None and isinstance(result, ClientResult):
                time.sleep(max(0.0, pace(task, result) - (time.perf_counter() - start)))
            out.append(result)
        return out

    def exchange(self, tasks: Sequence[ClientTask], driver: RoundDriver) -> list[ClientResult | ClientFailure]:
        sessions = [self.runner.open_session(t) for t in tasks]
        driver.drive(LocalRelay(sessions))
        return [s.close() for s in sessions]


def run_local(
    config: RunConfig, run_dir: str | Path | None = None, progress: Progress | None = None, resume: bool = False
) -> dict[str, Any]:
    """The whole federation in this process, sequentially (tests, debugging, the reference)."""
    with torch_threads():
        fed = build_federation(config)
        return run_federation(fed, InProcessExecutor(fed), run_dir or new_run_dir(config), progress, resume)

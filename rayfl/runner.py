"""Running a federation: the round loop over an executor, and the in-process runner.

`run_federation` is the one driver of rounds; the in-process runner gives it a sequential
executor in this process, the Ray coordinator gives it client actors. The in-process runner
is the reference the Ray runner must match exactly.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from . import checkpoint
from .algorithms.base import ClientFailure, ClientResult, ClientTask, ServerState
from .algorithms.exchange import LocalRelay, RoundDriver, SessionFailed, client_side
from .client import TORCH_THREADS, ClientRunner
from .config import ConfigError, RunConfig, dump_config
from .engine import Executor, Federation, GroupOutcome, Pace, RoundOutcome, build_federation, dispatch, evaluate, run_group, settle_round
from .metrics import Recorder, TensorBoard

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


def check_writable(run_dir: str | Path) -> None:
    """`ConfigError` naming RUN_DIR unless it is a folder this process can write in, or can be
    made; probes with a temporary folder it removes, so nothing is left behind."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path}: exists and is not a directory")
    parent = path
    while not parent.exists():
        parent = parent.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rayfl-probe-", dir=parent))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot create it under {parent} ({exc.strerror or exc})") from None


@dataclass(frozen=True)
class Start:
    """Where a run begins: round 0 with the initial weights, or a resumed run's newest intact
    checkpoint with the rows recorded up to it."""

    state: ServerState
    virtual_time_s: float
    recorder: Recorder


def prepare(config: RunConfig, run_dir: str | Path, resume: bool = False) -> tuple[Federation, Start]:
    """Everything that can be wrong with a run's input, found before anything is written or a
    cluster starts: the federation (data, partition, profile, model, policy), RUN_DIR writable,
    and with `resume` a readable checkpoint and tables."""
    fed = build_federation(config)
    check_writable(run_dir)
    if resume:
        state, virtual_time = checkpoint.latest(run_dir)
        return fed, Start(state, virtual_time, Recorder.reopen(run_dir, state.round))
    return fed, Start(fed.policy.init_state(fed.initial_weights()), 0.0, Recorder(run_dir))


def run_federation(fed: Federation, executor: Executor, run_dir: str | Path, start: Start, progress: Progress | None = None) -> dict[str, Any]:
    """All rounds of one federation from `start`; writes RUN_DIR as it goes and returns the summary.

    Round r's evaluation runs while round r + 1's clients train (its tasks are out first), so
    the clients' hosts never wait for it; its row is then recorded and checkpointed. A resumed
    run recomputes the rows after its checkpoint (identically, since every draw is keyed by round).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(fed.config, run_dir / "config.yaml")
    state, virtual_time, recorder = start.state, start.virtual_time_s, start.recorder
    board = TensorBoard(run_dir / "tb", (run_dir / "config.yaml").read_text(), state.round + 1) if fed.config.metrics.tensorboard else None
    elapsed = recorder.rounds[-1]["wall_time_s"] if recorder.rounds else 0.0
    fed_cfg = fed.config.federation
    t0 = time.perf_counter() - elapsed

    def finish(out: RoundOutcome) -> None:
        out = evaluate(fed, out)
        row = {**out.row, "wall_time_s": time.perf_counter() - t0}
        recorder.record(row, out.clients)
        if board is not None:
            board.add(row)
        if fed_cfg.checkpoint_every and (row["round"] % fed_cfg.checkpoint_every == 0 or row["round"] == fed_cfg.rounds):
            checkpoint.save(run_dir, out.state, row["virtual_time_s"])
        if progress is not None:
            progress(row)

    done: RoundOutcome | None = None
    try:
        for rnd in range(state.round + 1, fed_cfg.rounds + 1):
            next_round = dispatch(fed, state, rnd, executor)
            if done is not None:
                finish(done)
            done = settle_round(fed, state, next_round, virtual_time)
            state, virtual_time = done.state, done.row["virtual_time_s"]
        if done is not None:
            finish(done)
    finally:
        if board is not None:
            board.close()
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
    """Runs groups one after another in this process, with the same `ClientRunner` actors host."""

    def __init__(self, fed: Federation):
        self.runner = ClientRunner.of(fed)
        self.policy = fed.policy

    def submit(self, groups: Sequence[Sequence[ClientTask]], pace: Pace | None = None) -> Callable[[], list[GroupOutcome]]:
        def gather() -> list[GroupOutcome]:
            out = []
            for group in groups:
                start = time.perf_counter()
                out.append(run_group(self.runner, self.policy, group))
                if pace is not None:
                    time.sleep(max(0.0, pace(out[-1]) - (time.perf_counter() - start)))
            return out

        return gather

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


def exchange_failed(tasks: Sequence[ClientTask], reason: str) -> list[ClientFailure]:
    """Every session of a server-in-the-loop round that broke off: no client's update counts."""
    return [ClientFailure(t.client_id, t.round, f"exchange failed: {reason.splitlines()[0]}") for t in tasks]


def run_local(
    config: RunConfig, run_dir: str | Path | None = None, progress: Progress | None = None, resume: bool = False
) -> dict[str, Any]:
    """The whole federation in this process, sequentially (tests, debugging, the reference).
    With `resume`, RUN_DIR continues from its newest intact checkpoint."""
    run_dir = run_dir or new_run_dir(config)
    with torch_threads():
        fed, start = prepare(config, run_dir, resume)
        return run_federation(fed, InProcessExecutor(fed), run_dir, start, progress)

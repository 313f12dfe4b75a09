"""The run: a federation's rounds from a start (fresh or resumed) to the end, written to RUN_DIR.

`prepare` checks everything about a run's input before anything is written or a cluster
starts; `run_federation` takes the rounds a scheduler settles, evaluates, records and
checkpoints each, and returns the summary. The in-process runner and the Ray coordinator both
call it with their own executor.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from .. import checkpoint
from ..algorithms.capabilities import Collapses, Summarizes
from ..algorithms.messages import ServerState
from ..config import ConfigError, RunConfig, shown, to_dict
from ..metrics import Recorder, TensorBoard
from ..resume import computation_changes
from ..storage import dump_config
from .admission import Batteries
from .federation import Federation, build_federation
from .round import Executor, RoundOutcome, evaluate
from .scheduler import SCHEDULERS

log = logging.getLogger("rayfl")

Progress = Callable[[Mapping[str, Any]], None]


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
    pending: Any = None
    """A resumed deadline or asynchronous run's clients in flight at its checkpoint (`checkpoint.Saved.pending`)."""
    batteries: Batteries = field(default_factory=Batteries)
    """The devices' charge (a resumed run's at its checkpoint)."""
    moved: bool = False
    """Its rows were recorded in the driver's process, which began the run there while the actors
    came up (`Paused`, `ray.start_in_process`): the coordinator publishes them on its series too."""


class Paused(Exception):
    """`run_federation` stopped at a round boundary because its `pause` said so; `start` continues
    the run there: the state a checkpoint of that round holds (read back from its bytes, as a
    resume reads it) and the rows so far."""

    def __init__(self, start: Start):
        super().__init__(f"paused after round {start.state.round}")
        self.start = start


def prepare(config: RunConfig, run_dir: str | Path, resume: bool = False) -> tuple[Federation, Start]:
    """Everything that can be wrong with a run's input, found before anything is written or a
    cluster starts: the federation (data, partition, profile, model, policy), RUN_DIR writable,
    and with `resume` a readable checkpoint and tables."""
    fed = build_federation(config)
    collapse = fed.policy.collapsed() if isinstance(fed.policy, Collapses) else None
    if collapse:
        declared = fed.algorithm.default_profile
        hint = (
            f"; its paper's setting: devices.profile={declared}"
            if declared and declared != config.devices.profile
            else ""
        )
        log.warning(
            f"{config.algorithm.name} under devices.profile {config.devices.profile}: {collapse}, so it runs as its "
            f"baseline{hint}"
        )
    check_writable(run_dir)
    start = start_of(fed, run_dir, resume)
    if config.federation.checkpoint_every:
        checkpoint.encode(start.state)  # a state that cannot be checkpointed fails here, not after its first rounds
    return fed, start


def start_of(fed: Federation, run_dir: str | Path, resume: bool) -> Start:
    """Round 0, or with `resume` RUN_DIR's newest intact checkpoint and the rows up to it, once
    `check_resume` finds that they belong to this run."""
    fresh = fed.policy.init_state(fed.initial_weights())
    if resume:
        saved = checkpoint.latest(run_dir)
        recorder = Recorder.reopen(run_dir, saved.state.round)
        check_resume(fed.config, fresh, saved, recorder, f"--resume {run_dir}")
        return continuing(saved, recorder)
    return Start(fresh, 0.0, Recorder(run_dir))


def continuing(saved: checkpoint.Saved, recorder: Recorder, moved: bool = False) -> Start:
    """The start that continues a run from a checkpoint (read from its file or its bytes)."""
    return Start(saved.state, saved.virtual_time_s, recorder, saved.pending, saved.batteries or Batteries(), moved)


def check_resume(
    config: RunConfig, fresh: ServerState, saved: checkpoint.Saved, recorder: Recorder, where: str
) -> None:
    """`ConfigError` (one line, starting with `where`) unless a checkpoint belongs to the run
    being resumed: written by a run of the same config outside `RESUMABLE` (so the same algorithm,
    data, model and federation), named for its round, at a round within `federation.rounds`,
    with the model's array names, shapes and dtypes, finite arrays throughout, and the run's
    table holding one row for each round up to it."""
    name, state = saved.path.name if saved.path else "checkpoint", saved.state
    if saved.config is None:
        raise ConfigError(f"{where}: {name} does not say which run wrote it (an older rayfl's): start a new run")
    changes = computation_changes(saved.config, to_dict(config))
    if changes:
        key, was, now = changes[0]
        raise ConfigError(
            f"{where}: config.yaml does not belong to {name}: {key} is {shown(str(now), 80)} there, "
            f"{shown(str(was), 80)} in the checkpoint"
        )
    if saved.path and saved.path.name != f"round_{state.round:05d}.pt":
        raise ConfigError(f"{where}: {name} holds round {shown(str(state.round), 40)}, not the one its name says")
    if not 1 <= state.round <= config.federation.rounds:
        raise ConfigError(
            f"{where}: {name} is at round {state.round}, beyond federation.rounds {config.federation.rounds}"
        )
    model = {k: (v.shape, v.dtype) for k, v in fresh.weights.items()}
    held = {k: (v.shape, v.dtype) for k, v in state.weights.items()}
    if held != model:
        key = sorted(k for k in model.keys() | held.keys() if model.get(k) != held.get(k))[0]
        raise ConfigError(
            f"{where}: {name}'s weights do not fit the model at {shown(key, 80)} "
            f"(checkpoint {_shape(held.get(key))}, model {_shape(model.get(key))})"
        )
    bad = next(_not_finite(state, "state"), None)
    if bad:
        raise ConfigError(f"{where}: {name} holds NaN or infinite values at {shown(bad, 80)}")
    rows = [r["round"] for r in recorder.rounds]
    if rows != list(range(1, state.round + 1)):
        raise ConfigError(
            f"{where}: metrics.parquet does not hold one row for each of rounds 1..{state.round} of {name}"
        )


def _shape(entry: tuple[Any, Any] | None) -> str:
    return "none" if entry is None else f"{entry[1]} {tuple(entry[0])}"


def _not_finite(value: Any, where: str) -> Iterator[str]:
    """The paths of the floating arrays and numbers in a state that hold NaN or infinity."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            yield where
    elif isinstance(value, float):
        if not math.isfinite(value):
            yield where
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _not_finite(getattr(value, f.name), f"{where}.{f.name}")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _not_finite(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _not_finite(v, f"{where}[{i}]")


def run_federation(
    fed: Federation,
    executor: Executor,
    run_dir: str | Path,
    start: Start,
    progress: Progress | None = None,
    pause: Callable[[int], bool] | None = None,
) -> dict[str, Any]:
    """All rounds of one federation from `start` as the scheduler of its `federation.mode`
    settles them; writes RUN_DIR as it goes and returns the summary. Each round is evaluated, recorded,
    checkpointed and reported while the scheduler's next clients train. A resumed run recomputes
    the rows after its checkpoint (identically, since every draw is keyed by round). `pause(r)`,
    asked after each round r but the last, True: `Paused` with the start that continues the run
    (elsewhere: `ray.start_in_process`)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if start.state.round == 0:  # a fresh run (a resumed one starts from a checkpoint's round >= 1)
        checkpoint.clear(run_dir)
    dump_config(fed.config, run_dir / "config.yaml")
    recorder = start.recorder
    board = (
        TensorBoard(run_dir / "tb", (run_dir / "config.yaml").read_text(), start.state.round + 1)
        if fed.config.metrics.tensorboard
        else None
    )
    fed_cfg = fed.config.federation
    written_by = to_dict(fed.config)
    t0 = time.perf_counter() - (recorder.rounds[-1]["wall_time_s"] if recorder.rounds else 0.0)

    def finish(out: RoundOutcome) -> None:
        out = evaluate(fed, out)
        row = {**out.row, "wall_time_s": time.perf_counter() - t0}
        recorder.record(row, out.clients)
        if board is not None:
            board.add(row)
        if fed_cfg.checkpoint_every and (
            row["round"] % fed_cfg.checkpoint_every == 0 or row["round"] == fed_cfg.rounds
        ):
            checkpoint.save(run_dir, out.state, row["virtual_time_s"], out.pending, out.batteries, written_by)
        if progress is not None:
            progress(row)
        if pause is not None and out.state.round < fed_cfg.rounds and pause(out.state.round):
            saved = checkpoint.loads(checkpoint.dumps(out.state, row["virtual_time_s"], out.pending, out.batteries))
            raise Paused(continuing(saved, recorder, moved=True))

    rounds = SCHEDULERS[fed_cfg.mode]().rounds(
        fed, executor, start.state, start.virtual_time_s, start.pending, start.batteries.snapshot()
    )
    try:
        for out in rounds:
            finish(out)
    finally:
        rounds.close()  # a paused run's next clients never train here
        if board is not None:
            board.close()
    return summary_of(fed, recorder)


def summary_of(fed: Federation, recorder: Recorder) -> dict[str, Any]:
    """summary.json: the recorder's figures, and the run's setting and model size."""
    cost = fed.cost_of(fed.policy.global_model())
    extra = {
        "dataset": fed.config.data.name,
        "num_clients": fed.config.data.num_clients,
        "seed": fed.config.seed,
        "model_params": cost.num_params,
        "model_train_flops_per_sample": cost.train_flops,
        **(fed.policy.summary() if isinstance(fed.policy, Summarizes) else {}),
    }
    return recorder.summary(fed.config.algorithm.name, extra, fed.config.federation.target_accuracy)

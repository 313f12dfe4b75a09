"""Run outputs: round and client records -> `metrics.parquet`, `clients.parquet`, `summary.json`,
and TensorBoard events (`tb/`).

The tables are rewritten after every round, so a run that fails part-way keeps every round
it finished.
"""

from __future__ import annotations

import io
import json
import math
import numbers
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from .config import ConfigError
from .storage import naming, write_atomic

METRICS_COLUMNS = (
    "round",
    "virtual_time_s",
    "wall_time_s",
    "test_accuracy",
    "test_loss",
    "bytes_up",
    "bytes_down",
    "num_clients",
    "mean_wait_s",
)
SUMMARY_KEYS = (
    "algorithm",
    "rounds",
    "final_test_accuracy",
    "best_test_accuracy",
    "virtual_time_s",
    "wall_time_s",
    "bytes_total",
)


class Recorder:
    """Collects round and client rows for one RUN_DIR and writes them as Parquet. It keeps the
    absolute path: a recorder travels to the coordinator actor, whose working directory may differ."""

    def __init__(
        self, run_dir: str | Path, rounds: Sequence[Mapping[str, Any]] = (), clients: Sequence[Mapping[str, Any]] = ()
    ):
        self.run_dir = Path(run_dir).resolve()
        self.rounds: list[dict[str, Any]] = [dict(r) for r in rounds]
        self.clients: list[dict[str, Any]] = [dict(r) for r in clients]

    @classmethod
    def reopen(cls, run_dir: str | Path, through_round: int) -> "Recorder":
        """A run's recorder as it stood after `through_round` (later rows are dropped)."""
        run_dir = Path(run_dir)
        rounds = (
            pd.read_parquet(run_dir / "metrics.parquet") if (run_dir / "metrics.parquet").is_file() else pd.DataFrame()
        )
        clients = (
            pd.read_parquet(run_dir / "clients.parquet") if (run_dir / "clients.parquet").is_file() else pd.DataFrame()
        )
        keep = lambda df: df[df["round"] <= through_round].to_dict("records") if len(df) else []
        return cls(run_dir, keep(rounds), keep(clients))

    def record(self, row: Mapping[str, Any], clients: Iterable[Mapping[str, Any]]) -> None:
        self.rounds.append(dict(row))
        self.clients.extend(dict(c) for c in clients)
        self.flush()

    def metrics_frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rounds)
        first = [c for c in METRICS_COLUMNS if c in df.columns]
        return df[first + [c for c in df.columns if c not in first]]

    def flush(self) -> None:
        """Rewrite both tables; each is written aside and renamed (`storage.write_atomic`), so a run
        killed mid-write, or on a full disk, keeps the previous round's complete table."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name, frame in (("metrics", self.metrics_frame()), ("clients", pd.DataFrame(self.clients))):
            buffer = io.BytesIO()
            frame.to_parquet(buffer, index=False)
            write_atomic(self.run_dir / f"{name}.parquet", buffer.getvalue())

    def summary(
        self, algorithm: str, extra: Mapping[str, Any] | None = None, target: float | None = None
    ) -> dict[str, Any]:
        """The contract's summary keys (plus `extra`), written to `summary.json`. With a `target`
        accuracy, `time_to_target_s` is the virtual time of the first round reaching it (None if none did)."""
        acc = [r["test_accuracy"] for r in self.rounds if not math.isnan(r["test_accuracy"])]
        last = self.rounds[-1] if self.rounds else {}
        out = {
            "algorithm": algorithm,
            "rounds": len(self.rounds),
            "final_test_accuracy": acc[-1] if acc else None,
            "best_test_accuracy": max(acc) if acc else None,
            "virtual_time_s": last.get("virtual_time_s", 0.0),
            "wall_time_s": last.get("wall_time_s", 0.0),
            "bytes_total": int(sum(r["bytes_up"] + r["bytes_down"] for r in self.rounds)),
            "energy_j": float(sum(r.get("energy_j", 0.0) for r in self.rounds)),
            **(extra or {}),
        }
        if target is not None:
            reached = [r["virtual_time_s"] for r in self.rounds if r["test_accuracy"] >= target]
            out.update(target_accuracy=target, time_to_target_s=reached[0] if reached else None)
        write_atomic(self.run_dir / "summary.json", json.dumps(out, indent=2) + "\n")
        return out


class TensorBoard:
    """Each round's row as TensorBoard scalars and the run's config as text, in RUN_DIR/tb
    (`tensorboard --logdir RUN_DIR/tb`). A scalar's tag is its column, an algorithm's per-level
    or per-group `test_accuracy@a` as `test_accuracy/a`; its step is the round; NaN is left out.
    A fresh run starts the folder anew; a resumed one purges the events of the rounds it
    recomputes (a `SessionLog.START` at its first round, as `SummaryWriter(purge_step=)` writes),
    so each round appears once.

    Events are written in this thread (tensorboardX's `EventsWriter`, not `SummaryWriter`, whose
    writer thread dies on a full disk and leaves the run waiting on it): an `OSError` names the
    folder and ends the run like any other write."""

    def __init__(self, log_dir: str | Path, config_yaml: str, first_round: int):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.summary import text

        self.event = Event
        if first_round == 1:
            shutil.rmtree(log_dir, ignore_errors=True)  # a fresh run into an old RUN_DIR (its tables are rewritten too)
        # The file's name has the second it was made in; a resume within that second would
        # overwrite it, so the name also carries the first round (ordering the files as the
        # rounds) and a random part.
        suffix = f".{first_round:06d}.{uuid.uuid4().hex[:8]}"
        with naming(log_dir):
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self.events = EventsWriter(str(Path(log_dir) / "events"), suffix)
        self.path = log_dir
        self.write(
            Event(step=first_round, session_log=SessionLog(status=SessionLog.START)),
            Event(step=first_round - 1, summary=text("config", f"```yaml\n{config_yaml}```")),
        )

    def write(self, *events: Any) -> None:
        """The events appended, then flushed once."""
        with naming(self.path):
            for event in events:
                event.wall_time = time.time()
                self.events.write_event(event)
            self.events.flush()

    def add(self, row: Mapping[str, Any]) -> None:
        from tensorboardX.summary import scalar

        numbers_of = [
            (k, v)
            for k, v in row.items()
            if k != "round" and isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
        ]
        self.write(
            *(self.event(step=row["round"], summary=scalar(k.replace("@", "/"), float(v))) for k, v in numbers_of)
        )

    def close(self) -> None:
        with naming(self.path):
            self.events.close()


def read_metrics(run_dir: str | Path) -> pd.DataFrame:
    path = Path(run_dir) / "metrics.parquet"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no metrics.parquet (not a rayfl run directory?)")
    return pd.read_parquet(path)

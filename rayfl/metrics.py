"""Run outputs: round and client records -> `metrics.parquet`, `clients.parquet`, `summary.json`,
and TensorBoard events (`tb/`).

The tables are rewritten after every round, so a run that fails part-way keeps every round
it finished.
"""

from __future__ import annotations

import json
import math
import numbers
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from .config import ConfigError

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

    def __init__(self, run_dir: str | Path, rounds: Sequence[Mapping[str, Any]] = (), clients: Sequence[Mapping[str, Any]] = ()):
        self.run_dir = Path(run_dir).resolve()
        self.rounds: list[dict[str, Any]] = [dict(r) for r in rounds]
        self.clients: list[dict[str, Any]] = [dict(r) for r in clients]

    @classmethod
    def reopen(cls, run_dir: str | Path, through_round: int) -> "Recorder":
        """A run's recorder as it stood after `through_round` (later rows are dropped)."""
        run_dir = Path(run_dir)
        rounds = pd.read_parquet(run_dir / "metrics.parquet") if (run_dir / "metrics.parquet").is_file() else pd.DataFrame()
        clients = pd.read_parquet(run_dir / "clients.parquet") if (run_dir / "clients.parquet").is_file() else pd.DataFrame()
        keep = lambda df: df[df["round"] <= through_round].to_dict("records") if len(df) else []  # noqa: E731
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
        """Rewrite both tables; each is written aside and renamed, so a run killed mid-write
        keeps the previous round's complete table."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name, frame in (("metrics", self.metrics_frame()), ("clients", pd.DataFrame(self.clients))):
            tmp = self.run_dir / f".{name}.parquet.tmp"
            frame.to_parquet(tmp, index=False)
            tmp.replace(self.run_dir / f"{name}.parquet")

    def summary(self, algorithm: str, extra: Mapping[str, Any] | None = None, target: float | None = None) -> dict[str, Any]:
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
        (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2) + "\n")
        return out


class TensorBoard:
    """Each round's row as TensorBoard scalars and the run's config as text, in RUN_DIR/tb
    (`tensorboard --logdir RUN_DIR/tb`). A scalar's tag is its column, an algorithm's per-level
    or per-group `test_accuracy@a` as `test_accuracy/a`; its step is the round; NaN is left out.
    A fresh run starts the folder anew; a resumed one purges the events of the rounds it
    recomputes, so each round appears once."""

    def __init__(self, log_dir: str | Path, config_yaml: str, first_round: int):
        from tensorboardX import SummaryWriter

        if first_round == 1:
            shutil.rmtree(log_dir, ignore_errors=True)  # a fresh run into an old RUN_DIR (its tables are rewritten too)
        # The file's name has the second it was made in; a resume within that second would
        # overwrite it, so the name also carries the first round (ordering the files as the
        # rounds) and a random part.
        suffix = f".{first_round:06d}.{uuid.uuid4().hex[:8]}"
        self.writer = SummaryWriter(str(log_dir), purge_step=first_round, filename_suffix=suffix)
        self.writer.add_text("config", f"```yaml\n{config_yaml}```", global_step=first_round - 1)

    def add(self, row: Mapping[str, Any]) -> None:
        for key, value in row.items():
            if key != "round" and isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(key.replace("@", "/"), float(value), global_step=row["round"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def read_metrics(run_dir: str | Path) -> pd.DataFrame:
    path = Path(run_dir) / "metrics.parquet"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no metrics.parquet (not a rayfl run directory?)")
    return pd.read_parquet(path)

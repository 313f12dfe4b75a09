"""`rayfl compare RUN_DIR...`: runs side by side, as a table and as accuracy curves.

Runs whose configs differ only in `seed` (and in keys that do not change what a run computes:
`ray.*`, `metrics.*`, where checkpoints go, the reported target, and the settings of a
`federation.mode` the run does not use) are seeds of one config:
the table gives their mean and sample standard deviation, the plots their mean with the band
between the lowest and highest seed. A config is named by its algorithm and the keys in which it
differs from the other configs compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import yaml

from .config import ConfigError
from .metrics import read_metrics

NOT_COMPARED = (
    "seed",
    "ray.",
    "metrics.",
    "federation.checkpoint_every",
    "federation.target_accuracy",
    "data.data_dir",
)
"""Config keys (or prefixes) that do not change what a run computes: runs that differ only in
these are seeds of one config."""

FIGURES = {  # column -> (heading, format); mean (and spread) over the seeds of a config
    "final_accuracy": ("final accuracy", "{:.4f}"),
    "best_accuracy": ("best accuracy", "{:.4f}"),
    "time_to_target_s": ("time to target (virtual s)", "{:.0f}"),
    "rounds_to_target": ("rounds to target", "{:.1f}"),
    "virtual_time_s": ("virtual time s", "{:.0f}"),
    "bytes_mb": ("traffic MB", "{:.1f}"),
    "mean_wait_s": ("mean waiting s", "{:.2f}"),
    "wall_time_s": ("wall time s", "{:.1f}"),
}


def unused(key: str, config: dict[str, Any]) -> bool:
    """Whether `key` is a setting of a `federation.mode` the run does not use (a synchronous
    run's `federation.async.*`, say): it changes nothing the run computes."""
    mode = config.get("federation.mode", "sync")
    if key.startswith("federation.deadline."):
        return mode != "deadline"
    if key.startswith("federation.async."):
        return mode != "async"
    if key.startswith("federation.staleness."):
        return not (mode == "async" or (mode == "deadline" and config.get("federation.deadline.late") == "carry"))
    return False


@dataclass(frozen=True)
class Run:
    path: Path
    config: dict[str, Any]  # dotted keys, those compared
    target: float | None  # its federation.target_accuracy
    metrics: pd.DataFrame

    @classmethod
    def read(cls, path: str | Path) -> "Run":
        path = Path(path)
        metrics = read_metrics(path)
        config_file = path / "config.yaml"
        if not config_file.is_file():
            raise ConfigError(f"{path}: no config.yaml (not a rayfl run directory?)")
        flat = pd.json_normalize(yaml.safe_load(config_file.read_text()) or {}, sep=".").iloc[0].to_dict()
        target = flat.get("federation.target_accuracy")
        compared = {k: v for k, v in flat.items() if not k.startswith(NOT_COMPARED) and not unused(k, flat)}
        return cls(path, compared, None if pd.isna(target) else float(target), metrics)

    @property
    def key(self) -> tuple:
        """What makes runs seeds of one config: the compared keys, and the target they report against."""
        return (*sorted((k, repr(v)) for k, v in self.config.items()), ("federation.target_accuracy", self.target))

    def figures(self, target: float | None, last: int, columns: Sequence[str]) -> dict[str, float]:
        m = self.metrics
        evaluated = m.dropna(subset=["test_accuracy"])
        acc = evaluated["test_accuracy"]
        reached = evaluated[acc >= target] if target is not None else evaluated.iloc[:0]
        out = {
            "final_accuracy": float(acc.tail(last).mean()) if len(acc) else math.nan,
            "best_accuracy": float(acc.max()) if len(acc) else math.nan,
            "time_to_target_s": float(reached["virtual_time_s"].iloc[0]) if len(reached) else math.nan,
            "rounds_to_target": float(reached["round"].iloc[0]) if len(reached) else math.nan,
            "virtual_time_s": float(m["virtual_time_s"].iloc[-1]),
            "bytes_mb": float((m["bytes_up"] + m["bytes_down"]).sum()) / 1e6,
            "mean_wait_s": float(m["mean_wait_s"].mean()),
            "wall_time_s": float(m["wall_time_s"].iloc[-1]),
        }
        for column in columns:
            out[column] = float(m[column].mean()) if column in m else math.nan
        return out


def read_runs(run_dirs: Sequence[str | Path]) -> list[list[Run]]:
    """The runs grouped by config (seeds together), in the order each config first appears."""
    groups: dict[tuple, list[Run]] = {}
    for path in run_dirs:
        run = Run.read(path)
        groups.setdefault(run.key, []).append(run)
    return list(groups.values())


def labels(groups: Sequence[Sequence[Run]]) -> list[str]:
    """Each config's keys whose value differs among the configs compared, `k=v, ...`: an
    `algorithm.*` option among the configs of the same algorithm (its ablations), any other key
    among the configs that have it."""
    configs = [g[0].config for g in groups]

    def differs(key: str, config: dict[str, Any]) -> bool:
        peers = [
            c
            for c in configs
            if key in c and (not key.startswith("algorithm.") or c["algorithm.name"] == config["algorithm.name"])
        ]
        return len({repr(c[key]) for c in peers}) > 1

    return [", ".join(f"{k}={c[k]}" for k in sorted(c) if k != "algorithm.name" and differs(k, c)) for c in configs]


def table(
    groups: Sequence[Sequence[Run]],
    target: float | None = None,
    last: int = 1,
    columns: Sequence[str] = (),
    names: Sequence[str] | None = None,
) -> pd.DataFrame:
    """A row per config: algorithm, config (its differences, or its name from `names`), seeds, how
    many reached the target, and `<figure>_mean` / `<figure>_std` for each figure (and each extra
    metrics column: its mean over rounds). `target` defaults to each run's
    `federation.target_accuracy`."""
    rows = []
    for group, label in zip(groups, names or labels(groups)):
        per_seed = pd.DataFrame([r.figures(target if target is not None else r.target, last, columns) for r in group])
        row: dict[str, Any] = {"algorithm": group[0].config["algorithm.name"], "config": label, "seeds": len(group)}
        has_target = target is not None or group[0].target is not None
        row["reached"] = int(per_seed["rounds_to_target"].notna().sum()) if has_target else None
        for figure in per_seed.columns:
            row[f"{figure}_mean"] = per_seed[figure].mean()
            row[f"{figure}_std"] = per_seed[figure].std() if len(group) > 1 else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame, columns: Sequence[str] = ()) -> str:
    """The table as Markdown: `mean ± std` where several seeds, `-` where a figure has no value
    (no run reached the target: time and rounds to target are over the seeds that reached it)."""

    def cell(row: pd.Series, figure: str, fmt: str) -> str:
        mean, std = row[f"{figure}_mean"], row[f"{figure}_std"]
        if pd.isna(mean):
            return "-"
        return fmt.format(mean) + ("" if pd.isna(std) else f" ± {fmt.format(std)}")

    shown = {**FIGURES, **{c: (c, "{:.4g}") for c in columns}}
    out = pd.DataFrame(
        {
            "algorithm": frame["algorithm"],
            "config": frame["config"].replace("", "-"),
            "seeds": frame["seeds"],
            **{heading: [cell(r, f, fmt) for _, r in frame.iterrows()] for f, (heading, fmt) in shown.items()},
            "reached target": [
                "-" if pd.isna(r) else f"{int(r)}/{n}" for r, n in zip(frame["reached"], frame["seeds"])
            ],
        }
    )
    return out.to_markdown(index=False, disable_numparse=True)  # cells as formatted


def plot(groups: Sequence[Sequence[Run]], out_dir: str | Path, names: Sequence[str] | None = None) -> list[Path]:
    """Test accuracy against round, virtual time and bytes exchanged: a line per config (the mean
    of its seeds on a common grid), the band between its lowest and highest seed shaded; the
    legend names each config by its algorithm and differences, or by `names`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if names is None:  # the legend's names: the algorithm, with its differing options (without their prefix)
        short = [label.replace("algorithm.", "") for label in labels(groups)]
        names = [f"{g[0].config['algorithm.name']}{f' ({label})' if label else ''}" for g, label in zip(groups, short)]
    written = []
    for axis, heading in (
        ("round", "round"),
        ("virtual_time_s", "virtual time (s)"),
        ("bytes_mb", "traffic (MB, up + down)"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (group, name) in enumerate(zip(groups, names)):
            x, ys = curves(group, axis)
            if not len(x):  # no seed of this config was evaluated
                continue
            mean = ys.mean(axis=0)
            (line,) = ax.plot(
                x, mean, label=name, linewidth=1.4, linestyle="-" if i < 10 else "--"
            )  # past the 10 colours: dashed
            if len(group) > 1:
                ax.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.18, linewidth=0)
        ax.set_xlabel(heading)
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(0, -0.14), frameon=False)  # below the axes
        path = out_dir / f"accuracy_vs_{axis.removesuffix('_s').removesuffix('_mb')}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def curves(group: Sequence[Run], axis: str) -> tuple[np.ndarray, np.ndarray]:
    """Each seed's accuracy on one x grid: the evaluated rounds shared by all seeds, or (virtual
    time, bytes) 200 points from where the last seed's first evaluation is to where the shortest
    seed ends, linearly interpolated. Seeds never evaluated are left out (none: empty arrays)."""
    frames = []
    for run in group:
        m = run.metrics.assign(bytes_mb=(run.metrics["bytes_up"] + run.metrics["bytes_down"]).cumsum() / 1e6)
        frames.append(m.dropna(subset=["test_accuracy"]))
    frames = [f for f in frames if len(f)]  # a seed never evaluated has no curve
    if not frames:
        return np.zeros(0), np.zeros((0, 0))
    if axis == "round":
        rounds = sorted(set.intersection(*(set(f["round"]) for f in frames)))
        return np.array(rounds), np.stack(
            [f.set_index("round").loc[rounds, "test_accuracy"].to_numpy() for f in frames]
        )
    x = np.linspace(max(f[axis].iloc[0] for f in frames), min(f[axis].iloc[-1] for f in frames), 200)
    return x, np.stack([np.interp(x, f[axis], f["test_accuracy"]) for f in frames])


def compare(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path,
    target: float | None = None,
    last: int = 1,
    columns: Sequence[str] = (),
) -> tuple[str, list[Path]]:
    """The table (returned as Markdown, written as `compare.csv` and `compare.md`) and the three
    plots, in `out_dir`."""
    if target is not None and not 0 < target <= 1:
        raise ConfigError(f"--target: {target} is not an accuracy in (0, 1]")
    if last < 1:
        raise ConfigError(f"--last: {last} is not a number of rounds >= 1")
    groups = read_runs(run_dirs)
    for column in columns:
        if not any(column in r.metrics for g in groups for r in g):
            raise ConfigError(f"--column: no run's metrics.parquet has a column {column!r}")
    frame = table(groups, target, last, columns)
    text = markdown(frame, columns)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out_dir / "compare.csv", index=False)
    (out_dir / "compare.md").write_text(text + "\n")
    return text, [out_dir / "compare.csv", out_dir / "compare.md", *plot(groups, out_dir)]

"""`rayfl timeline RUN_DIR`: a run's virtual clock drawn as a Gantt chart (docs/time.md).

One row per client slot: in synchronous and deadline rounds the lowest row free when a
client's task starts (rounds follow each other along the clock, a late client keeping its row
until it arrives), in an asynchronous run one of the `concurrency` slots a finished client's
replacement takes over. Each client's task is drawn
as its download, compute and upload, then the time it waits for its round to close (in a
round-based run; an asynchronous client's slot is refilled when it arrives); a late
client is hatched and outlined in red (it ends after its round closed), a failed one outlined in
black, a dropped one (its device went offline mid-task: it ends there) cross-hatched in green, a
skipped one not drawn. Vertical lines mark the server's steps. An asynchronous run gets
a second panel: the histogram of its updates' staleness.

The segments come from `clients.parquet`: compute_s; the download and upload from bytes_down,
bytes_up and the download and upload bandwidths, the link latency (comm_s less the transfer times) split between
them. A synchronous run has no dispatch times recorded: its clients start as the round does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .config import ConfigError
from .metrics import read_metrics

COLORS = {"download": "#4c72b0", "compute": "#dd8452", "upload": "#8172b3", "waiting": "#d9d9d9"}
MARKS = {  # how a task that sent no update on time is outlined
    "late": dict(edgecolor="#c44e52", hatch="///", linewidth=1.2),
    "failed": dict(edgecolor="black", linewidth=1.2),
    "dropped": dict(edgecolor="#2ca02c", hatch="xx", linewidth=1.2),
}


def parse_rounds(text: str | None, last: int) -> tuple[int, int]:
    """'A-B' (or 'A') -> (A, B) within 1..last; `ConfigError` naming --rounds otherwise."""
    if text is None:
        return 1, last
    try:
        a, _, b = text.partition("-")
        lo, hi = int(a), int(b or a)
    except ValueError:
        raise ConfigError(f"--rounds {text}: write A-B (round numbers), e.g. 1-5") from None
    if not 1 <= lo <= hi <= last:
        raise ConfigError(f"--rounds {text}: the run has rounds 1-{last}")
    return lo, hi


def segments(run_dir: str | Path, rounds: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The clients of the chosen rounds with their segments' start times (`start`, `compute_at`,
    `upload_at`, `end`, `closes`) and row (`slot`), and the rounds' metrics rows."""
    metrics = read_metrics(run_dir)
    path = Path(run_dir) / "clients.parquet"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no clients.parquet (not a rayfl run directory?)")
    lo, hi = parse_rounds(rounds, int(metrics["round"].max()))
    metrics = metrics[metrics["round"].between(lo, hi)]
    c = pd.read_parquet(path)
    c = c[c["round"].between(lo, hi) & c["total_s"].notna()].copy()
    ends = dict(zip(metrics["round"], metrics["virtual_time_s"]))
    c["closes"] = c["round"].map(ends)
    if "dispatched_at" not in c:  # synchronous rounds: everyone starts with the round
        c["dispatched_at"] = c["round"].map(
            dict(zip(metrics["round"], metrics["virtual_time_s"] - metrics["round_time_s"]))
        )
    bps = c["bandwidth_mbps"] * 1e6
    up_bps = c["upload_mbps"] * 1e6 if "upload_mbps" in c else bps  # runs before up and down links differed
    latency = (c["comm_s"] - 8 * c["bytes_down"] / bps - 8 * c["bytes_up"] / up_bps).clip(lower=0) / 2
    c["start"] = c["dispatched_at"]
    c["compute_at"] = c["start"] + 8 * c["bytes_down"] / bps + latency
    c["upload_at"] = c["compute_at"] + c["compute_s"]
    c["end"] = c["start"] + c["total_s"]
    if mode(run_dir) != "async":
        c["slot"] = lanes(
            c["start"].to_numpy(), np.maximum(c["end"], c["closes"]).where(c["status"] != "late", c["end"]).to_numpy()
        )
    return c, metrics


def lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """A row for each task in a round-based run: the lowest row free when it starts (a late
    client holds its row past its round's close, so the next rounds' clients take others)."""
    free: list[float] = []
    out = np.empty(len(starts), int)
    for i in np.lexsort((np.arange(len(starts)), starts)):
        row = next((k for k, t in enumerate(free) if t <= starts[i] + 1e-9), len(free))
        if row == len(free):
            free.append(0.0)
        free[row], out[i] = ends[i], row
    return out


def mode(run_dir: str | Path) -> str:
    """The run's `federation.mode` (as its config.yaml says; runs before the modes: sync)."""
    path = Path(run_dir) / "config.yaml"
    config = yaml.safe_load(path.read_text()) if path.is_file() else {}
    return ((config or {}).get("federation") or {}).get("mode", "sync")


def bars(ax, rows, start: str, end: str, height: float = 0.8, **style) -> None:
    """One bar per row of `rows`, from column `start` to `end`, in each row's slot."""
    for y, group in rows.groupby("slot"):
        ax.broken_barh(list(zip(group[start], group[end] - group[start])), (y - height / 2, height), **style)


def draw_tasks(ax, c, asynchronous: bool) -> None:
    """Each task's download, compute and upload, a gap between tasks, the wait for the round's
    close (not in async: the slot is refilled at once), and the failed and late ones marked."""
    parts = {
        "download": ("start", "compute_at"),
        "compute": ("compute_at", "upload_at"),
        "upload": ("upload_at", "end"),
    }
    for part, (a, b) in parts.items():
        bars(ax, c, a, b, facecolors=COLORS[part], linewidth=0)
    bars(ax, c, "start", "end", facecolors="none", edgecolor="white", linewidth=0.8)
    if not asynchronous:
        bars(ax, c[c["closes"] > c["end"]], "end", "closes", facecolors=COLORS["waiting"], linewidth=0)
    for status, style in MARKS.items():
        bars(ax, c[c["status"] == status], "start", "end", facecolors="none", **style)


def draw_staleness(hist, c) -> None:
    """An asynchronous run's accepted updates by staleness."""
    from matplotlib.ticker import MaxNLocator

    stale = c.loc[c["status"] == "ok", "staleness"].astype(int)
    hist.bar(*np.unique(stale, return_counts=True), color="#55a868")
    hist.xaxis.set_major_locator(MaxNLocator(integer=True))
    hist.set_xlabel("staleness (server steps)")
    hist.set_ylabel("updates")
    hist.set_title(f"staleness: mean {stale.mean():.2f}, max {stale.max()}")


def draw(run_dir: str | Path, out: str | Path | None = None, rounds: str | None = None) -> Path:
    """Draw the run's timeline to `out` (default RUN_DIR/timeline.png); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    c, metrics = segments(run_dir, rounds)
    asynchronous = mode(run_dir) == "async"
    slots = int(c["slot"].max()) + 1 if len(c) else 1
    fig, axes = plt.subplots(
        1,
        2 if asynchronous else 1,
        figsize=(15 if asynchronous else 12, 1.2 + 0.32 * min(slots, 60)),
        gridspec_kw={"width_ratios": [4, 1]} if asynchronous else None,
        squeeze=False,
    )
    ax = axes[0][0]
    draw_tasks(ax, c, asynchronous)
    for t in metrics["virtual_time_s"]:
        ax.axvline(t, color="#555555", linewidth=0.6, linestyle=":")
    ax.set_ylim(slots - 0.5, -0.5)
    ax.set_yticks(range(slots) if slots <= 30 else np.linspace(0, slots - 1, 10).astype(int))
    ax.set_ylabel("client slot")
    ax.set_xlabel("virtual time (s); dotted: server steps")
    handles = [Patch(facecolor=v, label=k) for k, v in COLORS.items() if not (asynchronous and k == "waiting")]
    handles += [Patch(facecolor="none", label=status, **style) for status, style in MARKS.items()]
    below = -0.12 if slots > 8 else -0.25
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, below), ncol=7, frameon=False)
    lo, hi = int(metrics["round"].min()), int(metrics["round"].max())
    ax.set_title(f"{Path(run_dir).name}: rounds {lo}-{hi}")
    if asynchronous:
        draw_staleness(axes[0][1], c)
    fig.tight_layout()
    path = Path(out) if out is not None else Path(run_dir) / "timeline.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

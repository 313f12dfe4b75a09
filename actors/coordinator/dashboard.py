"""The coordinator's round rows as series on Ray's metrics endpoint (the dashboard's and
Prometheus's view of a run); `cluster/grafana/rayfl.json` charts them."""

from __future__ import annotations

import math
from typing import Any, Mapping

from ray.util import metrics as ray_metrics


class DashboardMetrics:
    """The round rows as series on Ray's metrics endpoint, tagged with run id and algorithm.

    Ray serves each name with a `ray_` prefix (and counters with a `_total` suffix) on every
    node's Prometheus endpoint: `rayfl_test_accuracy` is scraped as `ray_rayfl_test_accuracy`,
    `rayfl_bytes` as `ray_rayfl_bytes_total`. `cluster/grafana/rayfl.json` charts them.
    """

    TAGS = ("run_id", "algorithm")
    GAUGES = {  # name -> (description, the row's column)
        "rayfl_round": ("last finished round", "round"),
        "rayfl_test_accuracy": ("test accuracy of the global model (evaluated rounds)", "test_accuracy"),
        "rayfl_test_loss": ("test loss of the global model (evaluated rounds)", "test_loss"),
        "rayfl_train_loss": ("mean training loss of the round's accepted clients", "train_loss"),
        "rayfl_virtual_time_s": ("virtual clock at the end of the round, seconds", "virtual_time_s"),
        "rayfl_round_virtual_s": (
            "the round's duration on the virtual clock (its slowest client), seconds",
            "round_time_s",
        ),
        "rayfl_mean_wait_s": ("the round's mean client waiting time on the virtual clock, seconds", "mean_wait_s"),
        "rayfl_mean_staleness": (
            "mean staleness (server steps) of the updates a deadline or async step aggregated",
            "mean_staleness",
        ),
        "rayfl_max_staleness": (
            "largest staleness (server steps) of the updates a deadline or async step aggregated",
            "max_staleness",
        ),
    }
    ROUND_WALL = (
        "rayfl_round_wall_s",
        "wall seconds between this round's row and the previous one (rounds overlap with evaluation)",
    )
    ACTORS_ALIVE = ("rayfl_actors_alive", "client actors whose last call did not die")
    BYTES = ("rayfl_bytes", "bytes exchanged with clients since this coordinator started")
    CLIENTS = (
        "rayfl_clients",
        "selected clients by outcome (status: ok, failed, rejected, skipped, dropped, late, abandoned) since this "
        "coordinator started",
    )
    OUTCOMES = {
        "ok": "num_clients",
        "failed": "num_failed",
        "rejected": "num_rejected",
        "skipped": "num_skipped",
        "dropped": "num_dropped",
        "late": "num_late",
        "abandoned": "num_abandoned",
    }

    def __init__(self, run_id: str, algorithm: str, wall_time_s: float = 0.0):
        self.tags = {"run_id": run_id, "algorithm": algorithm}
        self.wall_time_s = wall_time_s  # the run's wall clock at the previous row
        self.gauges = {
            name: ray_metrics.Gauge(name, text, tag_keys=self.TAGS) for name, (text, _) in self.GAUGES.items()
        }
        self.round_wall = ray_metrics.Gauge(*self.ROUND_WALL, tag_keys=self.TAGS)
        self.actors_alive = ray_metrics.Gauge(*self.ACTORS_ALIVE, tag_keys=self.TAGS)
        self.bytes = ray_metrics.Counter(*self.BYTES, tag_keys=self.TAGS)
        self.clients = ray_metrics.Counter(*self.CLIENTS, tag_keys=(*self.TAGS, "status"))

    def record(self, row: Mapping[str, Any], actors_alive: int) -> None:
        for name, (_, column) in self.GAUGES.items():
            value = row.get(column, math.nan)  # staleness: deadline and async rows only
            if value == value:  # not NaN: a round without evaluation keeps the last accuracy
                self.gauges[name].set(value, tags=self.tags)
        self.round_wall.set(row["wall_time_s"] - self.wall_time_s, tags=self.tags)
        self.wall_time_s = row["wall_time_s"]
        self.actors_alive.set(actors_alive, tags=self.tags)
        if row["bytes_up"] + row["bytes_down"] > 0:  # Ray's counters refuse an increment of 0
            self.bytes.inc(row["bytes_up"] + row["bytes_down"], tags=self.tags)
        for status, column in self.OUTCOMES.items():
            if row.get(column, 0) > 0:
                self.clients.inc(row[column], tags={**self.tags, "status": status})

"""The coordinator actor: hosts one federation's round loop on Ray.

It owns the global model, the server policy, the device population, the virtual clock and
the metrics writer (the federation the driver built, read from the object store), and runs the
core's `run_federation` with a `RayExecutor` over the client actors, so its metrics equal the
in-process runner's. It is a
threaded actor (two threads): `run` drives the rounds while `progress` answers the driver.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

import ray
from ray.util import metrics as ray_metrics

from actors.client import NAMESPACE, actor_name, create_client_actors
from actors.pool import RayExecutor, check_fits, pool_size
from rayfl.engine import Federation
from rayfl.runner import Start, run_federation, torch_threads


class DashboardMetrics:
    """Gauges and counters on Ray's metrics endpoint, tagged with run id and algorithm."""

    TAGS = ("run_id", "algorithm")

    def __init__(self, run_id: str, algorithm: str):
        self.tags = {"run_id": run_id, "algorithm": algorithm}
        self.round = ray_metrics.Gauge("rayfl_round", "last finished round", tag_keys=self.TAGS)
        self.accuracy = ray_metrics.Gauge("rayfl_test_accuracy", "test accuracy of the global model", tag_keys=self.TAGS)
        self.virtual_time = ray_metrics.Gauge("rayfl_virtual_time_s", "virtual clock, seconds", tag_keys=self.TAGS)
        self.bytes = ray_metrics.Counter("rayfl_bytes", "bytes exchanged with clients", tag_keys=self.TAGS)
        self.updates = ray_metrics.Counter("rayfl_client_updates", "client updates aggregated", tag_keys=self.TAGS)

    def record(self, row: Mapping[str, Any]) -> None:
        self.round.set(row["round"], tags=self.tags)
        if row["test_accuracy"] == row["test_accuracy"]:  # not NaN
            self.accuracy.set(row["test_accuracy"], tags=self.tags)
        self.virtual_time.set(row["virtual_time_s"], tags=self.tags)
        if row["bytes_up"] + row["bytes_down"] > 0:  # Ray's counters refuse an increment of 0
            self.bytes.inc(row["bytes_up"] + row["bytes_down"], tags=self.tags)
        if row["num_clients"] > 0:
            self.updates.inc(row["num_clients"], tags=self.tags)


@ray.remote(max_concurrency=2)
class Coordinator:
    def __init__(self, federation_box: list, run_dir: str, run_id: str, clients: list):
        # Boxed, so the reference arrives unresolved: holding it keeps the federation (and its
        # dataset) in the object store for as long as the run, which a restarting client needs.
        self.federation_ref = federation_box[0]
        self.fed = ray.get(self.federation_ref)
        self.run_dir = run_dir
        self.run_id = run_id
        self.clients = clients
        self.metrics = DashboardMetrics(run_id, self.fed.config.algorithm.name)
        self._rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def warm(self) -> None:
        """While the client actors warm up: the libraries the round loop writes tables with, the
        global model's measured cost and an evaluation of it (first-call set-up)."""
        import pyarrow.parquet  # noqa: F401  (what `Recorder` writes with)

        from rayfl import metrics  # noqa: F401

        with torch_threads():
            self.fed.cost_of(self.fed.policy.global_model())
            self.fed.evaluator(self.fed.initial_weights(), self.fed.policy.global_model())

    def run(self, start: Start) -> dict[str, Any]:
        with torch_threads():
            return run_federation(self.fed, RayExecutor(self.clients, self.federation_ref, self.fed.policy), self.run_dir, start, self._on_round)

    def _on_round(self, row: Mapping[str, Any]) -> None:
        self.metrics.record(row)
        with self._lock:
            self._rows.append(dict(row))

    def progress(self) -> list[dict[str, Any]]:
        """Round rows finished since the last call."""
        with self._lock:
            rows, self._rows = self._rows, []
        return rows


def start_federation(fed: Federation, run_dir: str, run_id: str) -> tuple[ray.actor.ActorHandle, list[ray.actor.ActorHandle], ray.ObjectRef]:
    """Put the built federation in the object store once, start the client actors (as many as
    the free resources hold under `num_actors: auto`; `ConfigError` when the asked number can
    never fit the cluster) and `rayfl:<run_id>:coordinator`, all at once; returns them and the
    federation's reference (for warming the actors)."""
    num_actors = pool_size(fed.config, ray.available_resources())
    check_fits(fed.config, num_actors, ray.cluster_resources(), ray._private.state.state.get_max_resources_from_cluster_config())
    fed_ref = ray.put(fed)
    clients = create_client_actors(fed.config, run_id, num_actors)
    coordinator = Coordinator.options(name=actor_name(run_id, "coordinator"), namespace=NAMESPACE, num_cpus=0).remote(
        [fed_ref], run_dir, run_id, clients
    )
    return coordinator, clients, fed_ref

"""The Ray runner: identical metrics to the in-process runner, and survival of a killed actor."""

import threading
import time

import pandas as pd
import pytest

from rayfl import api
from rayfl.loader import load_config
from rayfl.runner import run_local

pytestmark = pytest.mark.ray


def tables(run_dir):
    metrics = pd.read_parquet(run_dir / "metrics.parquet").drop(columns="wall_time_s")
    return metrics, pd.read_parquet(run_dir / "clients.parquet")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cfg = load_config(None, ["federation.rounds=3"])
    run_dir = tmp_path_factory.mktemp("local")
    run_local(cfg, run_dir)
    return cfg, tables(run_dir)


@pytest.mark.parametrize("actors, cpus", [(1, 1.0), (3, 0.5)])
def test_ray_metrics_equal_the_in_process_runner(ray_cluster, reference, tmp_path, actors, cpus):
    cfg, (metrics, clients) = reference
    cfg = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"num_actors": actors, "cpus_per_actor": cpus})})
    summary = api.run(cfg, tmp_path)
    ray_metrics, ray_clients = tables(tmp_path)
    pd.testing.assert_frame_equal(ray_metrics, metrics)
    pd.testing.assert_frame_equal(ray_clients, clients)
    assert summary["final_test_accuracy"] == metrics["test_accuracy"].iloc[-1]
    assert not ray_cluster.util.list_named_actors(all_namespaces=True)  # the run cleaned up its actors


def test_a_killed_client_actor_does_not_fail_the_run(ray_cluster, tmp_path):
    # clock: emulate makes every task last about 0.3-1 s of wall time, so the kill lands mid-round.
    cfg = load_config(None, ["federation.rounds=4", "federation.clients_per_round=4", "model.name=mlp", "clock=emulate", "clock_scale=0.02", "ray.num_actors=2"])
    reference = tmp_path / "reference"
    run_local(cfg.model_copy(update={"clock": "virtual"}), reference)
    run_dir = tmp_path / "ray"
    victim = f"rayfl:{run_dir.name}:client-0"
    killed = []

    def kill_after_first_round():
        deadline = time.time() + 120
        while time.time() < deadline and not (run_dir / "metrics.parquet").exists():
            time.sleep(0.05)
        handle = ray_cluster.get_actor(victim, namespace="rayfl")
        ray_cluster.kill(handle, no_restart=False)
        killed.append(time.time())

    killer = threading.Thread(target=kill_after_first_round)
    killer.start()
    summary = api.run(cfg, run_dir)
    killer.join()
    assert killed, "the actor was never killed"
    metrics, clients = tables(run_dir)
    assert summary["rounds"] == 4 and metrics["num_clients"].tolist() == [4, 4, 4, 4]
    assert (clients["status"] == "ok").all()
    # The retried task re-ran from the same seeds: the results equal an undisturbed run.
    ref_metrics, _ = tables(reference)
    pd.testing.assert_frame_equal(metrics.drop(columns=["virtual_time_s", "round_time_s", "mean_wait_s"]), ref_metrics.drop(columns=["virtual_time_s", "round_time_s", "mean_wait_s"]))
    assert metrics["virtual_time_s"].tolist() == pytest.approx(ref_metrics["virtual_time_s"].tolist())


@pytest.mark.parametrize(
    "overrides",
    [
        # HeteroFL: sliced sub-models, static BN, per-level metrics.
        ["algorithm.name=heterofl", "algorithm.levels=a1-c1-e1", "model.norm=sbn", "federation.rounds=2"],
        # Split learning: 3 workers pinned to 2 actors (one actor holds two bottom models at once).
        ["algorithm.name=sfl", "model.name=cnn2", "federation.rounds=2", "federation.clients_per_round=3"],
        # MergeSFL: GA-selected workers with regulated batch sizes and merged features.
        ["algorithm.name=mergesfl", "model.name=cnn2", "federation.rounds=2", "algorithm.ga_generations=20"],
    ],
    ids=["heterofl", "sfl", "mergesfl"],
)
def test_algorithms_on_ray_equal_in_process(ray_cluster, tmp_path, overrides):
    cfg = load_config(None, [*overrides, "ray.num_actors=2"])
    run_local(cfg, tmp_path / "local")
    api.run(cfg, tmp_path / "ray")
    for a, b in zip(tables(tmp_path / "local"), tables(tmp_path / "ray")):
        pd.testing.assert_frame_equal(a, b)

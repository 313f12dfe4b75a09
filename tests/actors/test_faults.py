"""Faults on Ray end in the truth: a pool that heals, runs that never report success on a dead
pool, a coordinator that Ray restarts and that resumes by itself (the drills of issue 30)."""

import random
import threading
import time

import pandas as pd
import pytest

from actors.coordinator.executor import ActorsLost, RayExecutor
from actors.names import FederationRef
from rayfl import api
from rayfl.engine import build_federation
from rayfl.engine.round import groups_of
from rayfl.load import load_config
from rayfl.runner import run_local
from tests.actors.drills import AHEAD, actors_of, answering, at_round

pytestmark = [pytest.mark.ray, pytest.mark.faults, pytest.mark.slow]

SLOW = [
    "model.name=mlp",
    "clock=emulate",
    "clock_scale=0.01",
    "ray.num_actors=2",
    "federation.checkpoint_every=1",
    AHEAD,
]
"""Rounds of about 0.5-1 s of wall time (`clock: emulate`), so kills land mid-round, and a
coordinator never more than a round ahead of the drill's action (`drills.AHEAD`)."""


def metrics_of(run_dir):
    return pd.read_parquet(run_dir / "metrics.parquet").drop(columns="wall_time_s")


def undisturbed(cfg, run_dir):
    run_local(cfg.model_copy(update={"clock": "virtual"}), run_dir)
    return metrics_of(run_dir)


def assert_same_rounds(metrics, reference):
    """Every learning column equal; the virtual clock equal up to float summation order."""
    clock = ["virtual_time_s", "round_time_s", "mean_wait_s"]
    pd.testing.assert_frame_equal(metrics.drop(columns=clock), reference.drop(columns=clock))
    assert metrics["virtual_time_s"].tolist() == pytest.approx(reference["virtual_time_s"].tolist())


def test_chaos_random_client_kills_end_equal_to_the_undisturbed_run(ray_cluster, tmp_path):
    cfg = load_config(None, ["federation.rounds=10", *SLOW])  # AHEAD: round 7's kill lands before round 9 is recorded
    reference = undisturbed(cfg, tmp_path / "reference")
    run_dir = tmp_path / "chaos"
    kills: list[int] = []  # the rounds reported when each kill was made
    pick = random.Random(0)

    def chaos(row):  # 6 kills, one a reported round from round 2 on, of a random client actor (Ray restarts it)
        if row["round"] >= 2 and len(kills) < 6:
            clients = actors_of(run_dir.name, "client")
            answering(clients)  # every one up again: never one client killed twice
            ray_cluster.kill(pick.choice(clients), no_restart=False)
            kills.append(row["round"])

    summary = api.run(cfg, run_dir, progress=chaos)
    assert kills == [2, 3, 4, 5, 6, 7] and summary["rounds"] == 10
    assert_same_rounds(metrics_of(run_dir), reference)
    assert metrics_of(run_dir)["num_failed"].sum() == 0


def test_a_pool_whose_actors_stay_dead_ends_the_run_with_the_resume_hint(ray_cluster, tmp_path, capsys):
    cfg = load_config(None, ["federation.rounds=8", *SLOW, "ray.actor_timeout_s=15"])
    run_dir = tmp_path / "dead"
    # the bound also covers the actors' start: started here first (with the default bound) and
    # left idle in the warm pool, so that a loaded machine's slow start of new ones is not what ends the run
    api.run(load_config(None, ["federation.rounds=1", *SLOW]), tmp_path / "warm-up")

    def kill_for_good():
        for actor in actors_of(run_dir.name, "client"):
            ray_cluster.kill(actor)  # no restart

    with pytest.raises(api.RunFailed) as failed:
        api.run(cfg, run_dir, progress=at_round(2, kill_for_good))
    message = str(failed.value)
    assert message.startswith("ActorsLost: no client actor answered for") and "ray.actor_timeout_s = 15 s" in message
    assert "\n" not in message and message.endswith(f"continue it with: rayfl run --resume {run_dir}")
    rounds = metrics_of(run_dir)
    assert rounds["num_failed"].sum() == 0  # no round of failed clients was recorded as done
    assert len(rounds) < 8


def test_a_restarted_coordinator_resumes_by_itself_and_equals_the_undisturbed_run(ray_cluster, tmp_path, rayfl_notes):
    cfg = load_config(None, ["federation.rounds=6", *SLOW])
    reference = undisturbed(cfg, tmp_path / "reference")
    run_dir = tmp_path / "run"

    def kill_the_coordinator():
        ray_cluster.kill(actors_of(run_dir.name, "coordinator")[0], no_restart=False)

    rows = []
    kill = at_round(3, kill_the_coordinator)
    summary = api.run(cfg, run_dir, progress=lambda row: (rows.append(row), kill(row)))
    assert summary["rounds"] == 6
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6]  # rows recomputed after the restart are relayed once
    assert any("the coordinator actor died; Ray restarts it" in n for n in rayfl_notes)
    assert_same_rounds(metrics_of(run_dir), reference)


def rounds_run_again(notes):
    """The notes on rounds run again (not the waits a slow restart on a loaded machine reports)."""
    return [n for n in notes if n.startswith("round ")]


def test_a_split_round_whose_actor_dies_runs_its_exchange_again_and_equals_the_undisturbed_run(
    ray_cluster, tmp_path, rayfl_notes
):
    cfg = load_config(
        None,
        ["algorithm.name=sfl", "model.name=cnn2", "federation.rounds=4", "federation.clients_per_round=3", *SLOW[1:]],
    )
    reference = undisturbed(cfg, tmp_path / "reference")
    run_dir = tmp_path / "split"

    def kill_a_client():
        ray_cluster.kill(actors_of(run_dir.name, "client")[0], no_restart=False)

    summary = api.run(cfg, run_dir, progress=at_round(1, kill_a_client))
    assert summary["rounds"] == 4 and any("running the round's exchange again" in n for n in rayfl_notes)
    assert_same_rounds(metrics_of(run_dir), reference)
    assert metrics_of(run_dir)["num_failed"].sum() == 0


@pytest.fixture
def flaky(ray_cluster, tmp_path):
    """Client-actor stand-ins that die (`os._exit`) on the first `deaths` calls with a doomed
    client, counted in files (a restarted actor remembers nothing), and otherwise return the
    group's client ids."""

    @ray_cluster.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
    class Flaky:
        def __init__(self, folder, doomed, deaths):
            self.folder, self.doomed, self.deaths = folder, set(doomed), deaths

        def ready(self):
            return True

        def run_group(self, federation, tasks, weights, *, sums):
            import os
            from pathlib import Path

            first = tasks[0].client_id
            if first in self.doomed:
                count = Path(self.folder) / str(first)
                done = int(count.read_text()) if count.exists() else 0
                if done < self.deaths:
                    count.write_text(str(done + 1))
                    os._exit(1)
            return [t.client_id for t in tasks]

    cfg = load_config(None, ["federation.clients_per_round=6", "ray.clients_per_call=2", "model.name=mlp"])
    fed = build_federation(cfg)
    state = fed.policy.init_state(fed.initial_weights())
    groups = groups_of(fed.policy.configure(state, 1, list(range(6))), 2)  # clients 0-1, 2-3, 4-5
    made = []

    def make(doomed, deaths, count=2):
        actors = [Flaky.remote(str(tmp_path), doomed, deaths) for _ in range(count)]
        made.extend(actors)
        notes = []
        return (
            RayExecutor(actors, FederationRef(ray_cluster.put(None)), fed.account, timeout_s=120, report=notes.append),
            groups,
            notes,
        )

    yield make
    for actor in made:
        ray_cluster.kill(actor)


def test_a_group_whose_actor_dies_twice_runs_on_and_its_actor_rejoins(flaky):
    executor, groups, notes = flaky(doomed=[2], deaths=2)
    out = executor.submit(groups, sums=False)()
    assert out == [[0, 1], [2, 3], [4, 5]] and rounds_run_again(notes) == []
    executor.wait_until_up(executor.actors)  # the other may still be restarting when the groups are done
    assert executor.alive() == 2  # both actors answer again


def test_a_group_lost_three_times_fails_its_clients_under_the_failed_fraction(flaky):
    executor, groups, notes = flaky(doomed=[0], deaths=99)
    out = executor.submit(groups, sums=False)()
    assert out[1:] == [[2, 3], [4, 5]] and rounds_run_again(notes) == []  # 2 of 6 lost <= 0.5: recorded, not run again
    assert [(s.status, s.reason) for s in out[0].settled] == [("failed", "client actors died 3 times running it")] * 2


def test_a_round_that_loses_most_clients_runs_them_again_then_gives_up(flaky):
    executor, groups, notes = flaky(doomed=[0, 2], deaths=3)  # 4 of 6 lost on the first run, then they pass
    assert executor.submit(groups, sums=False)() == [[0, 1], [2, 3], [4, 5]]
    assert rounds_run_again(notes) == [
        "round 1: 4 of 6 clients lost to dying client actors (more than federation.max_failed_fraction = 0.5): "
        "running them again"
    ]
    executor, groups, notes = flaky(doomed=[4], deaths=99)
    executor.max_failed_fraction = 0.1
    with pytest.raises(ActorsLost, match=r"round 1: 2 of 6 clients lost to dying client actors in each of 3 runs"):
        executor.submit(groups, sums=False)()
    assert len(rounds_run_again(notes)) == 2


def test_losing_the_coordinators_node_then_a_clients_node_equals_the_undisturbed_run(tmp_path):
    """Its own 4-node cluster, in another process (`tests/actors/node_drill.py`)."""
    import json
    import subprocess
    import sys

    run_dir = tmp_path / "nodes"
    done = subprocess.run(
        [sys.executable, "-m", "tests.actors.node_drill", str(run_dir), "10"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        report["rounds"] == 10
        and len(report["killed"]) == 2
        and report["killed"][0] in ("A", "B")
        and report["killed"][1] != report["killed"][0]
    )
    cfg = load_config(None, ["federation.rounds=10", "model.name=mlp"])
    assert_same_rounds(metrics_of(run_dir), undisturbed(cfg, tmp_path / "reference"))


def test_two_live_runs_whose_run_dirs_share_a_name_share_a_cluster(ray_cluster, tmp_path):
    cfg = load_config(None, ["federation.rounds=4", *SLOW])
    first, second = tmp_path / "a" / "run", tmp_path / "b" / "run"
    summaries = {}
    started = threading.Thread(target=lambda: summaries.update(a=api.run(cfg, first)))
    started.start()
    deadline = time.time() + 300
    while not actors_of("run", "client") and time.time() < deadline:
        time.sleep(0.05)
    assert actors_of("run", "client")  # a's actors are live under the name `run`
    summaries["b"] = api.run(cfg, second)  # b's take `run-<hex>`
    started.join()
    assert summaries["a"]["rounds"] == summaries["b"]["rounds"] == 4
    assert_same_rounds(metrics_of(second), metrics_of(first))

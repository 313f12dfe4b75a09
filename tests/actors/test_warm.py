"""Warm actors shared between runs (actors/keeper.py): no state of one run reaches the next, a dead
run's actors come back, idle ones leave, and `rayfl pool` / `rayfl up` / `rayfl down`."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from actors import names
from actors.driver import pool
from actors.driver.head import free_port
from rayfl import api
from rayfl.load import load_config
from rayfl.runner import run_local
from tests.actors.drills import a_long_run, checkpoint_of, once_written
from tests.actors.ports_drill import listening, loopback
from tests.actors.test_ray_runner import tables

pytestmark = pytest.mark.ray

REFERENCE = ["federation.rounds=3", "ray.num_actors=2"]


def pool_status(ray):
    return ray.get(pool.keeper().status.remote())


def idle_names(ray):
    return sorted(e["name"] for e in pool_status(ray)["idle"])


@pytest.fixture(scope="module")
def fresh(ray_cluster, tmp_path_factory):
    """The reference run on new actors (the pool drained first), and the actors it left idle."""
    ray_cluster.get(pool.keeper().drain.remote())
    run_dir = tmp_path_factory.mktemp("fresh") / "run"
    api.run(load_config(None, REFERENCE), run_dir)
    return tables(run_dir), idle_names(ray_cluster)


def assert_equals_fresh(fresh, run_dir):
    for got, want in zip(tables(run_dir), fresh[0]):
        pd.testing.assert_frame_equal(got, want)


def test_runs_after_a_diverging_run_and_after_another_algorithm_equal_the_fresh_run(ray_cluster, fresh, tmp_path):
    cfg = load_config(None, REFERENCE)
    # Every client diverges, on another model: the actors held an MLP federation whose training went non-finite.
    api.run(load_config(None, [*REFERENCE, "federation.lr=1e6", "model.name=mlp"]), tmp_path / "diverged")
    assert (tables(tmp_path / "diverged")[1]["status"] == "failed").all()
    api.run(cfg, tmp_path / "after_diverged")
    assert_equals_fresh(fresh, tmp_path / "after_diverged")
    # Split learning: sessions on the actors, another model and dataset shape of batches.
    api.run(
        load_config(
            None,
            [
                "algorithm.name=sfl",
                "model.name=cnn2",
                "federation.rounds=2",
                "federation.clients_per_round=3",
                "ray.num_actors=2",
            ],
        ),
        tmp_path / "sfl",
    )
    api.run(cfg, tmp_path / "after_sfl")
    assert_equals_fresh(fresh, tmp_path / "after_sfl")
    assert idle_names(ray_cluster) == fresh[1]  # the same actors served every run
    clients = [ray_cluster.get_actor(name, namespace="rayfl") for name in fresh[1] if ":client-" in name]
    assert [ray_cluster.get(a.info.remote())["hosted"] for a in clients] == [
        None,
        None,
    ]  # handed back holding no federation


def test_a_run_after_a_killed_run_equals_the_fresh_run_and_the_killed_run_stops(ray_cluster, fresh, tmp_path):
    killed = tmp_path / "killed"
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rayfl",
            "run",
            "--address",
            ray_cluster.get_runtime_context().gcs_address,
            "--out",
            str(killed),
            "--set",
            "federation.rounds=40",
            "--set",
            "federation.checkpoint_every=1",
            "--set",
            "clock=emulate",
            "--set",
            "clock_scale=0.02",
            "--set",
            "ray.num_actors=2",
        ],
        env={**os.environ, "RAY_AUTH_MODE": "token"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.time() + 180
    while not checkpoint_of(killed, 2).exists() and driver.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert driver.poll() is None, driver.stderr.read().decode()[-2000:]
    assert (
        sorted(name for held in pool_status(ray_cluster)["leased"] for name in held["actors"]) == fresh[1]
    )  # it borrowed the warm actors
    os.killpg(driver.pid, signal.SIGKILL)  # no hand-back: its coordinator runs on, detached, until told to stop
    driver.wait()
    deadline = time.time() + 300  # the keeper reclaims the lease once Ray marks the killed driver's job dead
    while pool_status(ray_cluster)["leased"] and time.time() < deadline:
        time.sleep(0.1)
    assert pool_status(ray_cluster)["leased"] == [], "the killed driver's lease was never reclaimed"
    api.run(load_config(None, REFERENCE), tmp_path / "after_killed")
    assert_equals_fresh(fresh, tmp_path / "after_killed")
    assert idle_names(ray_cluster) == fresh[1] and pool_status(ray_cluster)["leased"] == []
    stopped = len(pd.read_parquet(killed / "metrics.parquet"))
    time.sleep(2.0)
    assert (
        stopped < 40 and len(pd.read_parquet(killed / "metrics.parquet")) == stopped
    )  # the orphaned run was abandoned


@pytest.mark.slow
def test_idle_actors_leave_after_the_idle_time_and_drain_empties_the_pool(ray_cluster, tmp_path):
    ray_cluster.get(pool.keeper().drain.remote())
    api.run(load_config(None, ["federation.rounds=1", "ray.num_actors=1", "ray.pool_idle_s=10"]), tmp_path / "short")
    idle = pool_status(ray_cluster)["idle"]  # the keeper's own clock: idle since the hand-back, 10 s in all
    assert len(idle) == 2 and all(0 < a["leaves_in_s"] <= 10 - a["idle_s"] + 0.5 for a in idle)
    deadline = time.time() + 120
    while pool_status(ray_cluster)["idle"] and time.time() < deadline:
        time.sleep(0.1)
    assert pool_status(ray_cluster)["idle"] == []
    api.run(load_config(None, ["federation.rounds=1", "ray.num_actors=1"]), tmp_path / "kept")
    assert len(pool_status(ray_cluster)["idle"]) == 2  # a coordinator host and a client actor, for 300 s
    assert pool.pool_command("drain") == "2 idle actors sent away; 0 leased to runs still going"
    assert pool_status(ray_cluster) == {"idle": [], "leased": []}


def test_with_no_idle_time_a_run_keeps_no_actor(ray_cluster, tmp_path):
    ray_cluster.get(pool.keeper().drain.remote())
    api.run(load_config(None, ["federation.rounds=1", "ray.num_actors=1", "ray.pool_idle_s=0"]), tmp_path / "run")
    assert pool_status(ray_cluster) == {"idle": [], "leased": []}
    assert not [a for a in ray_cluster.util.list_named_actors(all_namespaces=True) if a["name"] != names.KEEPER]


def test_an_edited_checkout_never_borrows_actors_running_the_old_code(monkeypatch):
    before = names.kinds(1.0, 0.0, "head", 3)
    monkeypatch.setattr(names, "_DIGEST", ["0123456789ab"])
    after = names.kinds(1.0, 0.0, "head", 3)
    assert before != after and all("0123456789ab" in kind for kind in after)
    assert (
        names.kinds(0.5, 0.0, "head", 3)[1] != after[1] and names.kinds(1.0, 0.25, "head", 3)[1] != after[1]
    )  # resources and device key them too


@pytest.mark.slow
def test_rayfl_up_keeps_a_head_whose_pool_the_next_run_reuses_and_down_stops_it(ray_cluster, tmp_path):
    """Beside another Ray head on the host (this session's, on Ray's default agent ports): the kept
    head takes free ports for every service, all on the loopback, and takes runs and jobs. A run going on it when
    `rayfl down` stops it ends at once with the line that says how to resume.

    Issue (CI): a job submitted to the kept head ran its driver against the cluster of the host's
    last `ray start` (Ray's job supervisor reads it from `ray_current_cluster` in Ray's temp folder)
    and was refused there for its token. Here that file, in this test's own Ray temp folder, names
    a head that is gone, as another `ray start` after `rayfl up` leaves it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # nothing of this session's Ray
    env["HOME"] = str(tmp_path / "home")  # its own ~/rayfl/head.json and token
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    rayfl = lambda *args: subprocess.run(
        [sys.executable, "-m", "rayfl", *args], env=env, capture_output=True, text=True, timeout=300
    )
    up = rayfl("up", "--num-cpus", "2", "--dashboard")
    assert up.returncode == 0 and "a local Ray head is up at 127.0.0.1:" in up.stdout, up.stderr
    record = __import__("json").loads((tmp_path / "home" / "rayfl" / "head.json").read_text())
    assert Path(record["temp_dir"]).parent == Path(env["RAY_TMPDIR"])
    try:
        for name in ("first", "second"):
            run = rayfl(
                "run", "--set", "federation.rounds=1", "--set", "ray.num_actors=2", "--out", str(tmp_path / name)
            )
            assert run.returncode == 0, run.stderr[-2000:]
        status = rayfl("pool", "status")
        lines = status.stdout.splitlines()
        assert lines[0] == "3 idle, 0 leased" and sum("rayfl:pool:client-" in line for line in lines) == 2, (
            status.stdout
        )
        pd.testing.assert_frame_equal(*(tables(tmp_path / name)[0] for name in ("first", "second")))
        sockets = listening(record["pid"])  # the head's GCS, raylet, agents, dashboard, the pooled actors
        assert {"gcs_server", "raylet"} <= {name for _, _, name in sockets}
        assert [s for s in sockets if not loopback(s[0])] == []
        last_started = Path(env["RAY_TMPDIR"], "ray", "ray_current_cluster")  # ray start writes it once up
        last_started.parent.mkdir(exist_ok=True)
        last_started.write_text(f"127.0.0.1:{free_port()}")
        job = rayfl("submit", "--address", record["dashboard"], "--wait", "--set", "federation.rounds=1")
        assert job.returncode == 0 and "final test accuracy" in job.stdout, job.stdout + job.stderr  # its own agent
        going = tmp_path / "going"  # a run that `rayfl down` stops under it
        run = a_long_run(going, env)
    finally:
        down = rayfl("down")
        head_dir_left = Path(record["temp_dir"]).exists()
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert down.returncode == 0 and down.stdout.strip() == "rayfl: the local head is down"
    err = run.communicate(timeout=120)[1]
    failed = [
        line for line in err.splitlines() if line.startswith("rayfl: run failed")
    ]  # Ray's own log lines may follow
    assert run.returncode == 1 and failed == [
        "rayfl: run failed: the cluster stopped under the run (rayfl down stopped its head); continue it with: rayfl "
        f"run --resume {going}"
    ], err[-3000:]
    with pytest.raises(ProcessLookupError):
        os.killpg(record["pid"], 0)  # the whole process group is gone
    assert not head_dir_left  # down removed the head's Ray temp folder
    assert rayfl("pool", "status").returncode == 2  # no running cluster any more


@pytest.mark.faults
@pytest.mark.slow
def test_a_keeper_killed_mid_run_reads_its_books_back_and_the_run_hands_its_actors_back(ray_cluster, tmp_path):
    """Issue: Ray restarted a killed keeper with empty books; its idle actors kept both CPUs,
    `pool status` showed 0 and `drain` freed nothing."""
    ray_cluster.get(pool.keeper().drain.remote())
    cfg = load_config(None, ["federation.rounds=3", "ray.num_actors=2", "federation.checkpoint_every=1"])
    run_dir = tmp_path / "run"
    killer = once_written(
        checkpoint_of(run_dir, 1), lambda: ray_cluster.kill(pool.keeper(create=False), no_restart=False)
    )
    api.run(cfg, run_dir)
    killer.join()
    status = pool.ask(lambda k: k.status.remote())  # asked again while Ray restarts it
    assert status["leased"] == [] and len(status["idle"]) == 3  # the run's coordinator host and 2 clients
    run_local(cfg, tmp_path / "in-process")
    for got, want in zip(tables(run_dir), tables(tmp_path / "in-process")):
        pd.testing.assert_frame_equal(got, want)
    gone, leased = ray_cluster.get(pool.keeper().drain.remote())
    assert (gone, leased) == (3, 0)
    deadline = time.monotonic() + 300
    while ray_cluster.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # the idle actors' CPUs come back once Ray has stopped them
    assert ray_cluster.available_resources().get("CPU", 0) == 2


def test_a_pooled_actor_in_no_book_is_sent_away_after_its_grace():
    from actors.keeper import ORPHAN_GRACE_S, overdue

    unbooked, due = overdue({}, {"a", "b"}, now=100.0)
    assert unbooked == {"a": 100.0, "b": 100.0} and due == []
    unbooked, due = overdue(unbooked, {"a", "b", "c"}, now=100.0 + ORPHAN_GRACE_S - 0.5)
    assert due == [] and unbooked["c"] == 100.0 + ORPHAN_GRACE_S - 0.5
    unbooked, due = overdue(unbooked, {"a", "c"}, now=100.0 + ORPHAN_GRACE_S)  # b was booked meanwhile
    assert due == ["a"] and unbooked == {"c": 100.0 + ORPHAN_GRACE_S - 0.5}

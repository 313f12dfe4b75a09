"""The Ray runner: identical metrics to the in-process runner, and survival of a killed actor."""

import time

import pandas as pd
import pytest

from rayfl import api
from rayfl.load import load_config
from rayfl.runner import run_local
from tests.actors.drills import AHEAD, actors_of, at_round, holds_nothing
from tests.test_dropouts import DEVICES
from tests.test_time import ABANDONS

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
    assert holds_nothing(tmp_path.name)  # the run handed back its actors


def test_under_rounds_ahead_the_coordinator_records_no_more_than_that_past_the_drivers_last_row(ray_cluster, tmp_path):
    cfg = load_config(None, ["federation.rounds=5", "model.name=mlp", "ray.num_actors=1", "ray.rounds_ahead=1"])
    run_dir = tmp_path / "run"
    recorded = []  # with each row passed on: the rounds the coordinator had written

    def slow_progress(row):
        time.sleep(1.0)  # meanwhile an unbounded coordinator would record all 5 rounds
        recorded.append((row["round"], len(pd.read_parquet(run_dir / "metrics.parquet"))))

    api.run(cfg, run_dir, progress=slow_progress)
    assert [r for r, _ in recorded] == [1, 2, 3, 4, 5]
    assert all(n <= r + 1 for r, n in recorded), recorded


def test_the_coordinator_keeps_a_row_until_the_driver_says_it_passed_it_on():
    """A reply lost on the way (`ActorUnavailableError` from a coordinator that lives) loses no
    row: the driver, asking again with the last round it passed on, gets it again."""
    from actors.coordinator.actor import Coordinator

    host = Coordinator.__ray_metadata__.modified_class()  # the class itself, in this process
    host._rows = [{"round": 1}, {"round": 2}]
    assert [r["round"] for r in host.progress(0)[0]] == [1, 2]
    assert [r["round"] for r in host.progress(0)[0]] == [1, 2]  # the first reply never arrived
    assert [r["round"] for r in host.progress(1)[0]] == [2] and host.progress(2)[0] == []


@pytest.mark.faults
@pytest.mark.slow
def test_a_killed_client_actor_does_not_fail_the_run(ray_cluster, tmp_path):
    # clock: emulate makes every task last about 0.3-1 s of wall time, so the kill lands mid-round.
    cfg = load_config(
        None,
        [
            "federation.rounds=4",
            "federation.clients_per_round=4",
            "model.name=mlp",
            "clock=emulate",
            "clock_scale=0.02",
            "ray.num_actors=2",
            AHEAD,
        ],
    )
    reference = tmp_path / "reference"
    run_local(cfg.model_copy(update={"clock": "virtual"}), reference)
    run_dir = tmp_path / "ray"
    killed = []

    def kill_a_client():
        ray_cluster.kill(actors_of(run_dir.name, "client")[0], no_restart=False)
        killed.append(len(pd.read_parquet(run_dir / "metrics.parquet")))  # the rounds the run had finished

    summary = api.run(cfg, run_dir, progress=at_round(1, kill_a_client))
    assert killed and killed[0] <= 2, f"the actor was killed after round {killed} of 4"  # AHEAD: at most one round on
    metrics, clients = tables(run_dir)
    assert summary["rounds"] == 4 and metrics["num_clients"].tolist() == [4, 4, 4, 4]
    assert (clients["status"] == "ok").all()
    # The retried task re-ran from the same seeds: the results equal an undisturbed run.
    ref_metrics, _ = tables(reference)
    pd.testing.assert_frame_equal(
        metrics.drop(columns=["virtual_time_s", "round_time_s", "mean_wait_s"]),
        ref_metrics.drop(columns=["virtual_time_s", "round_time_s", "mean_wait_s"]),
    )
    assert metrics["virtual_time_s"].tolist() == pytest.approx(ref_metrics["virtual_time_s"].tolist())


FEW = ["data.num_clients=8", "federation.clients_per_round=4"]


def slow_but(cases, ids, fast):
    """Parameters of `cases`, named by `ids`: the executor paths in `fast` run in the default suite,
    the others under the `slow` marker (the long suite CI runs too)."""
    values = [c if isinstance(c, tuple) else (c,) for c in cases]  # a tuple: the values of several names
    return [pytest.param(*v, id=i, marks=() if i in fast else pytest.mark.slow) for v, i in zip(values, ids)]


ALGORITHM_CASES = [
    # 10^9 logical clients: device classes and data sizes drawn per client when asked (rayfl/rng.py).
    ["data.name=synthetic", "model.name=mlp", "data.num_clients=1000000000", "federation.rounds=2"],
    # HeteroFL: sliced sub-models, static BN, per-level metrics.
    ["algorithm.name=heterofl", "algorithm.levels=a1-c1-e1", "model.norm=sbn", "federation.rounds=2"],
    # Vectorized: each call's clients trained in one batched computation (torch.func.vmap).
    ["model.name=mlp", "ray.vectorize=4", "federation.rounds=2", "data.num_clients=20"],
    # Split learning: 3 workers pinned to 2 actors (one actor holds two bottom models at once).
    ["algorithm.name=sfl", "model.name=cnn2", "federation.rounds=2", "federation.clients_per_round=3"],
    # MergeSFL: GA-selected workers with regulated batch sizes and merged features.
    ["algorithm.name=mergesfl", "model.name=cnn2", "federation.rounds=2", "algorithm.ga_generations=20"],
    # InclusiveFL: depth groups with their own heads, per-group FedAdam and momenta.
    ["algorithm.name=inclusivefl", "devices.profile=mobile", "federation.rounds=2"],
    # m-FeDepth: depth-wise stages with auxiliary heads, cached prefixes, MKD peers kept per client.
    [
        "algorithm.name=mfedepth",
        "devices.profile=fedepth_surplus",
        "federation.batch_size=128",
        "federation.rounds=2",
    ],
    # SplitMix: each client's share of the base networks; DepthFL: prefixes with FedDyn state per client.
    ["algorithm.name=splitmix", "devices.profile=fedepth_fair", "federation.batch_size=128", "federation.rounds=2"],
    [
        "algorithm.name=depthfl",
        "devices.profile=fedepth_fair",
        "federation.batch_size=128",
        "federation.rounds=2",
        "model.aux_heads=1-2-3-4-6",
    ],
    # FedSup: M sandwich-sampled sub-nets per step; E-FedSup: a tier sub-net per client (variants
    # mixed on an actor).
    ["algorithm.name=fedsup", "federation.rounds=1", *FEW],
    ["algorithm.name=efedsup", "devices.profile=mobile", "federation.rounds=2", *FEW],
    # Personalized baselines keep per-client models (Ditto's v_k, LG-FedAvg's bodies, Local-only's
    # models); Per-FedAvg's meta-steps; the personalization metrics (Ditto's) from both runners alike.
    *(
        [
            f"algorithm.name={a}",
            "federation.rounds=2",
            "data.partition.kind=shards",
            f"federation.personalize_epochs={int(a == 'ditto')}",
            "data.num_clients=10",
            "federation.clients_per_round=4",
        ]
        for a in ("ditto", "lgfedavg", "localonly", "perfedavg")
    ),
]
ALGORITHM_IDS = [
    "1e9-clients",
    "heterofl",
    "vectorized",
    "sfl",
    "mergesfl",
    "inclusivefl",
    "mfedepth",
    "splitmix",
    "depthfl",
    "fedsup",
    "efedsup",
    "ditto",
    "lgfedavg",
    "localonly",
    "perfedavg",
]


@pytest.mark.parametrize(
    "overrides", slow_but(ALGORITHM_CASES, ALGORITHM_IDS, {"1e9-clients", "heterofl", "vectorized", "mergesfl"})
)
def test_algorithms_on_ray_equal_in_process(ray_cluster, tmp_path, overrides):
    assert_ray_equals_local(overrides, tmp_path)


def assert_ray_equals_local(overrides, tmp_path):
    """Run on 2 client actors and in process; the tables must be equal. Returns Ray's client rows."""
    cfg = load_config(None, [*overrides, "ray.num_actors=2"])
    run_local(cfg, tmp_path / "local")
    api.run(cfg, tmp_path / "ray")
    for a, b in zip(tables(tmp_path / "local"), tables(tmp_path / "ray")):
        pd.testing.assert_frame_equal(a, b)
    return tables(tmp_path / "ray")[1]


@pytest.mark.parametrize(
    "overrides",
    [
        # Every client diverges: rounds with no update (the dashboard counters see increments of 0).
        ["federation.lr=1e6", "federation.rounds=3", "model.name=mlp"],
        # Clients with no sample (skipped) and with one (batch norm fails): both runners alike.
        ["data.num_clients=2000", "data.partition={kind: dirichlet, min_size: 0}", "federation.rounds=2"],
        ["data.num_clients=2000", "data.partition.kind=iid", "federation.rounds=2"],
    ],
    ids=["diverged", "min-size-0", "iid-2000"],
)
def test_failed_and_skipped_clients_are_recorded_alike_on_ray(ray_cluster, tmp_path, overrides):
    assert (assert_ray_equals_local(overrides, tmp_path)["status"] != "ok").any()


def test_actors_that_never_fit_exit_2_at_once(tmp_path):
    # 3 client actors x all of this machine's CPUs each: a local cluster can never place them.
    # Refused before Ray starts: Ray writes no session under the process's RAY_TMPDIR.
    import os
    import subprocess
    import sys

    ray_tmp = tmp_path / "ray-tmp"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rayfl",
            "run",
            "--set",
            "ray.num_actors=3",
            "--set",
            f"ray.cpus_per_actor={os.cpu_count()}",
            "--set",
            "ray.dashboard=false",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={  # no cluster of this session's, no kept head to join
            **{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
            "HOME": str(tmp_path / "home"),
            "RAY_TMPDIR": str(ray_tmp),
        },
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"rayfl: error: ray.num_actors: 3 client actors x {os.cpu_count()} CPU need"
    ), lines
    assert not ray_tmp.exists() and not (tmp_path / "run").exists()


def test_pending_actors_are_reported_until_the_timeout(idle_cluster):
    ray_cluster = idle_cluster
    from actors import raystate
    from actors.driver.crew import create_client_actors, wait_for_actors
    from rayfl.config import ConfigError

    cfg = load_config(None, ["ray.cpus_per_actor=1", "model.name=mlp"])
    # An autoscaling cluster that can grow to 4 CPUs fits 3 actors of 1 CPU, not 5.
    cfg.resources.check_fits(3, {"CPU": 4}, grows=True)
    with pytest.raises(
        ConfigError, match=r"^ray.num_actors: 5 client actors x 1 CPU need 5 CPU; the cluster has 4 even at its largest"
    ):
        cfg.resources.check_fits(5, {"CPU": 4}, grows=True)
    actors = create_client_actors(
        cfg, [f"pending-test-{k}" for k in range(3)], pooled=False
    )  # 3 CPUs on a 2-CPU cluster
    notes = []
    try:
        up, _ = ray_cluster.wait([a.info.remote() for a in actors], num_returns=2, timeout=120)
        assert len(up) == 2  # two fit; the third can never be placed while they live
        with pytest.raises(RuntimeError, match=r"1 of 3 client actors did not start within ray.actor_timeout_s = 8 s"):
            wait_for_actors(actors, timeout_s=8, report=notes.append, every_s=0.5)  # a report every 0.5 s
        placed, deadline = [None], time.time() + 300
        while None in placed and time.time() < deadline:  # a busy GCS's read is unknown (None): asked again
            placed = [raystate.placed(a) for a in actors]
            time.sleep(0.1)
    finally:
        for actor in actors:
            ray_cluster.kill(actor)
    assert notes and "for 1 of 3 client actors to be placed (free now: {'CPU': 0.0, 'GPU': 2.0}" in notes[-1]
    assert sorted(placed) == [False, True, True]


def test_actors_that_are_placed_but_still_starting_are_not_reported(idle_cluster):
    ray_cluster = idle_cluster
    from actors import raystate
    from actors.driver.crew import wait_for_actors

    @ray_cluster.remote(num_cpus=1)
    class SlowStart:
        def __init__(self):
            time.sleep(4.0)  # its constructor takes 4 s once Ray has given it a worker

        def info(self):
            return {}

    actors = [SlowStart.remote() for _ in range(2)]
    notes = []
    try:
        deadline = time.monotonic() + 120  # however long a busy machine takes to start the workers
        while not all(raystate.placed(a) for a in actors) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(raystate.placed(a) for a in actors)
        wait_for_actors(actors, timeout_s=30, report=notes.append, every_s=0.5)
    finally:
        for actor in actors:
            ray_cluster.kill(actor)
    assert notes == []


@pytest.mark.faults
@pytest.mark.slow
def test_a_dead_coordinator_ends_the_run_with_one_line_saying_how_to_resume(ray_cluster, tmp_path):
    cfg = load_config(
        None,
        [
            "federation.rounds=6",
            "federation.checkpoint_every=1",
            "model.name=mlp",
            "clock=emulate",
            "clock_scale=0.05",
            "ray.num_actors=1",
            AHEAD,
        ],
    )
    run_dir = tmp_path / "run"

    def kill_the_coordinator():  # for good
        ray_cluster.kill(actors_of(run_dir.name, "coordinator")[0])

    with pytest.raises(api.RunFailed) as failed:
        api.run(cfg, run_dir, progress=at_round(2, kill_the_coordinator))
    message = str(failed.value)
    assert "\n" not in message and message.startswith("the coordinator actor died")
    assert message.endswith(f"continue it with: rayfl run --resume {run_dir}")
    assert holds_nothing(run_dir.name)  # the clients were handed back
    summary = api.run(load_config(run_dir / "config.yaml"), run_dir, resume=True)
    assert summary["rounds"] == 6


TIMED = {
    # deadline rounds over-selecting 30%, late updates carried, a deadline as well
    "deadline": ["federation.mode=deadline", "federation.deadline.late=carry", "federation.deadline.deadline_s=8"],
    # ... and rounds with fewer than 9 updates on time abandoned
    "deadline-abandons": ABANDONS,
    # FedBuff: 6 in flight, a server step per 3 arrivals; FedAsync: a step per arrival
    "fedbuff": ["federation.mode=async", "federation.async.concurrency=6", "federation.async.buffer_size=3"],
    "fedasync": ["federation.mode=async", "federation.async.rule=fedasync", "federation.async.concurrency=4"],
    # HeteroFL's count aggregation over FedBuff's buffer of width sub-models
    "heterofl-fedbuff": [
        "algorithm.name=heterofl",
        "algorithm.levels=a1-c1-e1",
        "model.norm=sbn",
        "federation.mode=async",
        "federation.async.concurrency=6",
        "federation.async.buffer_size=3",
    ],
    # devices that come and go: diurnal sessions of 2 minutes, batteries, arrivals and departures
    "sync-devices": DEVICES,
    "fedbuff-devices": [
        *DEVICES,
        "federation.mode=async",
        "federation.async.concurrency=6",
        "federation.async.buffer_size=3",
    ],
}


@pytest.fixture(scope="module")
def timed_reference(tmp_path_factory):
    """The in-process run of each TIMED config, made once."""
    done = {}

    def get(name):
        if name not in done:
            cfg = load_config(None, ["model.name=mlp", "data.num_clients=30", "federation.rounds=4", *TIMED[name]])
            run_dir = tmp_path_factory.mktemp(name)
            run_local(cfg, run_dir)
            done[name] = cfg, tables(run_dir)
        return done[name]

    return get


# FedAvg's deadline rounds and FedBuff on 1, 2 and 3 actors; FedAsync, HeteroFL and devices that come and go on 2. The
# actors take 2 clients a call (in process 5): outside sync rounds updates come back whole.
TIMED_ON_ACTORS = [
    *((n, a, c) for n in ("deadline", "fedbuff") for a, c in ((1, 1.0), (2, 1.0), (3, 0.5))),
    *((n, 2, 1.0) for n in ("fedasync", "heterofl-fedbuff", "sync-devices", "fedbuff-devices", "deadline-abandons")),
]


@pytest.mark.parametrize(
    "name, actors, cpus",
    slow_but(
        TIMED_ON_ACTORS,
        [f"{n}-{a}-{c}" for n, a, c in TIMED_ON_ACTORS],
        {"deadline-3-0.5", "fedbuff-3-0.5", "deadline-abandons-2-1.0"},
    ),
)
def test_deadline_and_async_runs_on_ray_equal_in_process(ray_cluster, timed_reference, tmp_path, name, actors, cpus):
    cfg, (metrics, clients) = timed_reference(name)
    assert name != "deadline-abandons" or 0 < metrics["abandoned"].sum() < len(metrics)  # both kinds of round
    cfg = cfg.model_copy(
        update={"ray": cfg.ray.model_copy(update={"num_actors": actors, "cpus_per_actor": cpus, "clients_per_call": 2})}
    )
    api.run(cfg, tmp_path)
    for a, b in zip((metrics, clients), tables(tmp_path)):
        pd.testing.assert_frame_equal(b, a)

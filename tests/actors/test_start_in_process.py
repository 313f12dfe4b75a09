"""A run begun in the driver's process while its actors come up, moved onto them at a round
boundary (`ray.start_in_process`, `actors/driver/launch.py`): the same tables as the run in
process, wherever it moves, and a RUN_DIR that a resume continues alike."""

import dataclasses
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from actors.driver import handover, launch
from rayfl import api
from rayfl.load import load_config
from rayfl.runner import run_local
from tests.actors.drills import checkpoint_of

SMALL = ["federation.rounds=4", "data.num_clients=12", "federation.clients_per_round=4", "model.name=mlp"]
SETUPS = {
    "fedavg": [],
    "heterofl": ["algorithm.name=heterofl"],
    "mergesfl": ["algorithm.name=mergesfl", "model.name=cnn2"],  # split: server and clients exchange in a round
    "fedbuff": ["federation.mode=async", "federation.async.concurrency=6"],  # clients in flight at the boundary
    "deadline": ["federation.mode=deadline"],
}


def tables(run_dir):
    metrics = pd.read_parquet(run_dir / "metrics.parquet").drop(columns="wall_time_s")
    return metrics, pd.read_parquet(run_dir / "clients.parquet")


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Each setup run in process once (what every executor must equal)."""
    done = {}
    for name, sets in SETUPS.items():
        run_dir = tmp_path_factory.mktemp(f"local-{name}")
        run_local(load_config(None, [*SMALL, *sets]), run_dir)
        done[name] = tables(run_dir)
    return done


@pytest.fixture
def info_notes(rayfl_notes):
    """rayfl's notices down to INFO (the line that says where the run moved), as the CLI logs them."""
    log = logging.getLogger("rayfl")
    level = log.level
    log.setLevel(logging.INFO)
    yield rayfl_notes
    log.setLevel(level)


class MovingAfter(handover.Rule):
    """The run moves after round `at` (waiting there for the actors), or never (None); the rounds
    it was asked after are kept."""

    def __init__(self, at):
        self.at, self.asked = at, []

    def moves(self, round, ready):
        self.asked.append(round)
        return round == self.at


class Paced(handover.Rule):
    """The pace decides also on the session's running cluster, over round 2 (round 1 is never long
    enough); `outlook` says the actors finish sooner (`moves`) or later, its arguments kept."""

    timed_round_s = 60.0

    def __init__(self, moves):
        self.wants_move, self.asked = moves, []

    def paced(self, own):
        return True

    def outlook(self, *args):
        self.asked.append(args)
        seen = super().outlook(*args)
        return dataclasses.replace(seen, actors_s=seen.here_s / 2 if self.wants_move else seen.here_s * 2)


@pytest.mark.parametrize("at", [1, 3, None], ids=["moves-after-1", "moves-after-3", "never-moves"])
@pytest.mark.parametrize("setup", list(SETUPS))
def test_a_run_begun_in_process_ends_with_the_tables_of_the_run_in_process(
    ray_cluster, references, tmp_path, info_notes, setup, at
):
    rule = MovingAfter(at)
    timings = {}
    cfg = load_config(None, [*SMALL, *SETUPS[setup], "ray.start_in_process=true", "ray.num_actors=2"])
    summary = api.run(cfg, tmp_path / "run", timings=timings, hand_over=rule)
    assert summary["rounds"] == 4
    assert rule.asked == ([1, 2, 3] if at is None else list(range(1, at + 1)))  # never after the last round
    moved = [note for note in info_notes if "ran in this process" in note]
    if at is None:
        assert moved == [] and "rounds" not in timings  # the whole run here; the actors never ran a round
    else:
        here = "round 1" if at == 1 else f"rounds 1-{at}"
        assert moved == [f"{here} ran in this process while the actors came up; the actors run the rest"]
        assert timings["rounds"] > 0
    for got, want in zip(tables(tmp_path / "run"), references[setup]):
        pd.testing.assert_frame_equal(got, want, check_exact=True)


@pytest.mark.parametrize("moves", [False, True], ids=["stays", "moves"])
def test_a_run_on_its_own_cluster_decides_before_ray_starts_where_it_finishes(
    ray_cluster, references, tmp_path, monkeypatch, info_notes, moves
):
    """The decision (`outlook`) comes after round 2 (round 1 is short), before Ray's start: the
    rounds left, the driver's pace over round 2, the actors the machine holds, its free cores. A
    run that stays starts no cluster and equals the run in process; one that moves starts Ray
    then and ends with the same tables. One line says which, and why."""
    rule, connected, real_connect = Paced(moves), [], launch.connect
    monkeypatch.setattr(launch, "connect", lambda *args: connected.append(args) or real_connect(*args))
    cfg = load_config(None, [*SMALL, "ray.start_in_process=true"])
    api.run(cfg, tmp_path / "run", hand_over=rule)
    [(rounds_left, pace, actors, free, cpus)] = rule.asked
    assert (
        rounds_left == 2 and 0 < pace < 60 and actors == min(4, os.cpu_count()) and 0 <= free <= cpus == os.cpu_count()
    )
    assert len(connected) == moves  # Ray started only for the actors
    said = [n for n in info_notes if n.startswith("the run ")]
    assert said[0].startswith(
        "the run moves onto its actors once they are up: its 2 rounds left take about"
        if moves
        else "the run finishes in this process, no Ray cluster started: its 2 rounds left take about"
    ), said
    for got, want in zip(tables(tmp_path / "run"), references["fedavg"]):
        pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_a_run_over_before_its_pace_is_timed_starts_no_cluster(tmp_path, monkeypatch, info_notes):
    connected = []  # (a failure raised in the bring-up's thread would never reach the test)

    def connecting(*args):
        connected.append(args)
        raise RuntimeError("Ray was started")

    monkeypatch.setattr(launch, "connect", connecting)
    cfg = load_config(None, [*SMALL, "federation.rounds=2", "ray.start_in_process=true"])
    api.run(cfg, tmp_path / "run", hand_over=Paced(moves=True))
    assert connected == []
    assert len(pd.read_parquet(tmp_path / "run" / "metrics.parquet")) == 2
    assert not [n for n in info_notes if n.startswith("the run ")]


def test_the_actors_start_only_when_they_finish_the_rounds_left_sooner():
    """`outlook` by hand: Ray's start 5 CPU seconds, each actor process's 3 (the coordinator and
    the clients), on the free cores but the driver's (half of one when none is); then the pace
    split over the actors the free cores hold, 20% more."""
    # the reference workload, 2 quiet cores: the start alone (14 s on 1 core) outlasts 28 x 0.27 s
    quiet = handover.outlook(28, 0.27, 2, 2.0, 2.0)
    assert not quiet.moves and quiet.here_s == pytest.approx(7.56) and quiet.actors_s == pytest.approx(14.0)
    # the default run (1 s rounds): 14 rounds here while they start, then 14 x 0.6 s
    default = handover.outlook(28, 1.0, 2, 2.0, 2.0)
    assert default.moves and default.actors_s == pytest.approx(14.0 + 14 * 0.6)
    # one core busy with other work: the start on half a core, then 1.2 s a round, however long the run
    for rounds in (28, 1000):
        busy = handover.outlook(rounds, 1.0, 2, 1.0, 2.0)
        assert not busy.moves and busy.actors_s == pytest.approx(28.0 + max(0, rounds - 28) * 1.2)
    # 16 quiet cores, 8 actors: the start in 32 / 15 s, then 1.2 / 8 s a round
    wide = handover.outlook(100, 1.0, 8, 16.0, 16.0)
    assert wide.moves and wide.actors_s == pytest.approx(32 / 15 + (100 - 32 / 15) * 0.15)
    assert quiet.line() == (
        "the run finishes in this process, no Ray cluster started: its 28 rounds left take about 8 s here, about "
        "14 s on 2 actors with their start (2.0 of 2 cores free of other work)"
    )


def test_a_resume_from_a_checkpoint_written_before_the_move_equals_the_undisturbed_run(
    ray_cluster, references, tmp_path
):
    cfg = load_config(None, [*SMALL, *SETUPS["fedbuff"], "ray.start_in_process=true", "federation.checkpoint_every=1"])
    run_dir = tmp_path / "run"
    api.run(cfg, run_dir, hand_over=MovingAfter(3))
    for later in (3, 4):  # as if the run had stopped after round 2, in process
        checkpoint_of(run_dir, later).unlink()
    api.run(
        cfg, run_dir, resume=True, hand_over=MovingAfter(3)
    )  # begun in process again from round 2, moved after round 3
    for got, want in zip(tables(run_dir), references["fedbuff"]):
        pd.testing.assert_frame_equal(got, want, check_exact=True)


@pytest.mark.parametrize("moved", [True, False], ids=["moved", "resumed"])
def test_the_coordinator_publishes_the_rows_recorded_before_the_move_and_not_a_resumed_runs(tmp_path, moved):
    """The dashboard's series carry the rounds the driver ran (they appear late, never missing); a
    resumed run's earlier rounds were published by the run that recorded them (its counters would
    count them twice)."""
    from actors.coordinator.actor import Assignment, Coordinator
    from actors.names import FederationRef
    from rayfl.engine import Paused, build_federation, prepare
    from rayfl.runner import InProcessExecutor, run_in_process

    published = []

    class Series:  # `DashboardMetrics` without Ray's metrics agent
        def __init__(self, run_id, algorithm, wall_time_s=0.0):
            pass

        def record(self, row, actors_alive):
            published.append(row["round"])

    class Executor(InProcessExecutor):
        def alive(self):
            return 1

    cfg = load_config(None, SMALL)
    fed, start = prepare(cfg, tmp_path)
    with pytest.raises(Paused) as paused:
        run_in_process(fed, start, tmp_path, pause=lambda r: r == 2)
    start = paused.value.start if moved else dataclasses.replace(paused.value.start, moved=False)
    host = Coordinator.__ray_actor_class__()  # the class as written, in this process
    host.series = Series
    host.fed = build_federation(cfg)  # as built: what the actors get
    host.executor = Executor(host.fed)
    # attached already: `run` reads nothing from Ray
    host.assignment = Assignment(FederationRef(ObjectId()), [], str(tmp_path), "run")
    host.run(host.assignment, start)
    assert published == ([1, 2, 3, 4] if moved else [3, 4])


class ObjectId:
    def hex(self):
        return "00"


def test_under_auto_only_a_run_that_starts_its_own_cluster_with_cpu_actors_begins_in_process():
    cfg = lambda *sets: load_config(None, list(sets))
    assert launch.starts_in_process(cfg(), running=False)
    assert not launch.starts_in_process(cfg(), running=True)  # a running cluster's actors answer at once
    assert not launch.starts_in_process(cfg("ray.gpus_per_actor=0.5"), running=False)  # another device
    assert not launch.starts_in_process(cfg("ray.start_in_process=false"), running=False)
    assert launch.starts_in_process(cfg("ray.start_in_process=true"), running=True)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["starting", "moving", "moved"])
def test_a_ctrl_c_in_each_phase_leaves_no_ray_process_and_a_run_dir_that_resumes_to_the_same_tables(tmp_path, phase):
    """`rayfl run` with a local cluster of its own (`tests/actors/interrupt_drill.py`): a Ctrl-C
    while Ray starts, during the hand-over, and after it."""
    from tests.actors.interrupt_drill import SETS

    ray_tmp = tempfile.mkdtemp(prefix="rf-", dir="/tmp")  # this run's Ray processes name it (short: socket paths)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path / "home"), RAY_TMPDIR=ray_tmp)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "tests.actors.interrupt_drill", phase, str(run_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = [line for line in done.stderr.splitlines() if line.startswith("rayfl: interrupted")]
    assert done.returncode == 130 and said == [f"rayfl: interrupted; continue it with: rayfl run --resume {run_dir}"], (
        done.stderr[-3000:]
    )
    assert list(Path(ray_tmp, "ray").glob("session_2*"))  # Ray had started
    left = lambda: [p.pid for p in psutil.process_iter(["cmdline"]) if ray_tmp in " ".join(p.info["cmdline"] or [])]
    deadline = time.monotonic() + 300
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left() == []
    recorded = len(pd.read_parquet(run_dir / "metrics.parquet"))
    assert recorded == {"starting": 1, "moving": 2}.get(phase, recorded) and recorded < 5
    cfg = load_config(None, SETS)
    run_local(cfg, run_dir, resume=True)
    run_local(cfg, tmp_path / "undisturbed")
    for got, want in zip(tables(run_dir), tables(tmp_path / "undisturbed")):
        pd.testing.assert_frame_equal(got, want, check_exact=True)

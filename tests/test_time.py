"""Deadline and asynchronous federations on the virtual clock (rayfl/engine/deadline.py,
rayfl/engine/asynchronous.py, docs/time.md): a deadline round closed by hand numbers, the
order of events in async runs, late clients kept out while they train, and resume."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from rayfl import checkpoint, timeline
from rayfl.algorithms.messages import ClientResult
from rayfl.config.load import load_config
from rayfl.devices import DeviceState
from rayfl.engine import build_federation
from rayfl.engine.admission import Batteries
from rayfl.engine.asynchronous import Queue
from rayfl.engine.deadline import Late, close
from rayfl.engine.flights import Flight
from rayfl.engine.host import GroupOutcome, Settled
from rayfl.engine.round import Dispatched
from rayfl.runner import InProcessExecutor, run_local
from rayfl.timeline import segments

SMALL = ["model.name=mlp", "data.num_clients=30", "metrics.tensorboard=false"]


class HandClock:
    """Every device does 1 FLOP/s over an instant link: a client's time is its FLOPs."""

    def available(self, round, t):
        return range(30)

    def state(self, client, round):
        return DeviceState("hand", 1.0, 1e300, 1e300, 0.0)

    def until(self, client, round, t, horizon):
        return float("inf")

    def size(self, t):
        return 30


def hand_round(finish, *sets):
    """Round 1 of a deadline federation whose clients c finish at finish[c] virtual seconds,
    each sending the initial model plus c; returns the closed round and the initial weights."""
    cfg = load_config(None, [*SMALL, "federation.mode=deadline", *sets])
    fed = dataclasses.replace(build_federation(cfg), population=HandClock())
    state = fed.policy.init_state(fed.initial_weights())
    tasks = [fed.policy.task(c, 1, state.weights) for c in sorted(finish)]
    records = []
    for t in tasks:
        moved = {k: v + t.client_id if v.dtype.kind == "f" else v for k, v in state.weights.items()}
        out = ClientResult.of(t, weights=moved, num_examples=10, num_samples=10, train_loss=0.0)
        records.append(Settled(out, "ok", "", (finish[t.client_id], 0, 0)))
    d = Dispatched(1, sorted(finish), tasks, None, lambda: [GroupOutcome(records, {})], [])
    return close(fed, d, state, 0.0, Late(fed, None, None)), state.weights


FINISH = {0: 5.0, 1: 2.0, 2: 9.0, 3: 2.0}  # clients 1 and 3 tie at 2 s


@pytest.mark.parametrize(
    "sets, closes_at, on_time",
    [
        (["federation.deadline.target_clients=2"], 2.0, [1, 3]),  # the 2nd update: client 3, tied with 1 at 2 s
        (["federation.deadline.target_clients=1"], 2.0, [1]),  # a tie goes to the lower client id
        (
            ["federation.deadline.target_clients=3", "federation.deadline.deadline_s=4"],
            4.0,
            [1, 3],
        ),  # the deadline first
        (["federation.deadline.target_clients=4"], 9.0, [0, 1, 2, 3]),  # everyone, the slowest last
        (["federation.deadline.target_clients=4", "federation.deadline.deadline_s=7"], 7.0, [0, 1, 3]),
    ],
)
def test_a_deadline_round_closes_at_the_kth_update_or_the_deadline(sets, closes_at, on_time):
    out, w0 = hand_round(FINISH, *sets)
    rows = {r["client_id"]: r for r in out.clients}
    assert out.row["round_time_s"] == closes_at and out.row["virtual_time_s"] == closes_at
    assert sorted(c for c, r in rows.items() if r["status"] == "ok") == on_time
    late = sorted(set(FINISH) - set(on_time))
    assert sorted(c for c, r in rows.items() if r["status"] == "late") == late
    assert out.row["num_late"] == len(late) and out.row["num_clients"] == len(on_time)
    for c in on_time:
        assert rows[c]["wait_s"] == closes_at - FINISH[c] and rows[c]["arrived_at"] == FINISH[c]
    for c in late:  # charged what it spent: its whole task
        assert rows[c]["total_s"] == FINISH[c] and "after the round closed" in rows[c]["reason"]
    # FedAvg over the updates on time only: w0 + the mean of their client ids (equal sizes)
    first = next(k for k in w0 if k.endswith("weight"))
    np.testing.assert_allclose(out.state.weights[first], w0[first] + np.mean(on_time), atol=1e-5)


def tables(run_dir):
    return pd.read_parquet(run_dir / "metrics.parquet"), pd.read_parquet(run_dir / "clients.parquet")


@pytest.fixture(scope="module")
def carry_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("carry")
    run_local(
        load_config(
            None, [*SMALL, "federation.rounds=6", "federation.mode=deadline", "federation.deadline.late=carry"]
        ),
        run_dir,
    )
    return run_dir


def test_carried_updates_join_the_round_they_arrive_in_and_their_clients_wait(carry_dir):
    metrics, clients = tables(carry_dir)
    assert (metrics["num_late"] == 3).all()  # 13 selected, closed at the 10th update
    assert (metrics["num_selected"] == 13).all() and (metrics["model_version"] == metrics["round"]).all()
    assert metrics["num_carried"].iloc[1:].sum() > 0 and metrics["num_carried"].iloc[0] == 0
    assert (metrics["num_clients"] == 10 + metrics["num_carried"]).all()
    assert metrics.loc[metrics["num_carried"] > 0, "max_staleness"].min() >= 1
    starts = dict(zip(metrics["round"], metrics["virtual_time_s"] - metrics["round_time_s"]))
    ends = dict(zip(metrics["round"], metrics["virtual_time_s"]))
    late = clients[clients["status"] == "late"]
    for row in late.itertuples():
        assert row.arrived_at > ends[row.round]
        # never selected again while it trains: no round starting before its arrival picks it
        again = clients[(clients["client_id"] == row.client_id) & (clients["round"] > row.round)]
        assert all(starts[r] >= row.arrived_at for r in again["round"])
    # the rounds' clocks chain: each starts where the previous closed
    assert np.allclose(list(starts.values())[1:], list(ends.values())[:-1])


@pytest.fixture(scope="module", params=["fedbuff", "fedasync"])
def async_run(request, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp(request.param)
    sets = [
        *SMALL,
        "federation.rounds=8",
        "federation.mode=async",
        f"federation.async.rule={request.param}",
        "federation.async.concurrency=6",
        "federation.async.buffer_size=3",
    ]
    summary = run_local(load_config(None, sets), run_dir)
    return request.param, summary, *tables(run_dir), run_dir


def test_async_events_follow_the_virtual_clock(async_run):
    rule, summary, metrics, clients, _ = async_run
    k = 3 if rule == "fedbuff" else 1
    assert (clients.groupby("round").size() == k).all() and len(metrics) == 8
    # arrivals in order of time (ties by client id), each step at its last arrival
    order = list(zip(clients["arrived_at"], clients["client_id"]))
    assert order == sorted(order)
    assert np.allclose(clients.groupby("round")["arrived_at"].max().to_numpy(), metrics["virtual_time_s"].to_numpy())
    # staleness: the server steps between download and arrival
    assert (clients["staleness"] == clients["round"] - 1 - clients["model_version"]).all()
    assert metrics["max_staleness"].max() >= 1
    # a client's planned arrival is what its task costs when it succeeds
    ok = clients[clients["status"] == "ok"]
    np.testing.assert_allclose(ok["arrived_at"] - ok["dispatched_at"], ok["total_s"], rtol=1e-12)
    # every slot refilled at once: 6 in flight whenever the clock is past the first arrival
    first, last = clients["arrived_at"].min(), clients["arrived_at"].max()
    for t in np.linspace(first, last, 17)[1:-1]:
        flying = ((clients["dispatched_at"] <= t) & (clients["arrived_at"] > t)).sum()
        assert flying <= 6
    assert set(clients["slot"]) <= set(range(6))
    assert summary["rounds"] == 8 and 0 < summary["final_test_accuracy"] <= 1


def test_an_async_client_trains_once_per_model_version(tmp_path):
    # 6 clients, all in flight: the one that just arrived is the only one free, and it waits
    # for the next version instead of training on the same model again
    sets = [
        "model.name=mlp",
        "data.num_clients=6",
        "data.partition.kind=iid",
        "federation.clients_per_round=6",
        "metrics.tensorboard=false",
    ]
    run_local(
        load_config(
            None,
            [
                *sets,
                "federation.rounds=6",
                "federation.mode=async",
                "federation.async.concurrency=6",
                "federation.async.buffer_size=3",
            ],
        ),
        tmp_path,
    )
    _, clients = tables(tmp_path)
    assert len(clients) == 18 and not clients.duplicated(["client_id", "model_version"]).any()


class Instant(HandClock):
    """Devices that take no time at all: every task arrives the moment it leaves."""

    def state(self, client, round):
        return DeviceState("instant", float("inf"), float("inf"), float("inf"), 0.0)


def test_async_arrivals_at_one_instant_go_in_client_id_order():
    cfg = load_config(
        None, [*SMALL, "federation.mode=async", "federation.async.concurrency=6", "federation.async.buffer_size=3"]
    )
    fed = dataclasses.replace(build_federation(cfg), population=Instant())
    queue = Queue(fed, InProcessExecutor(fed), fed.policy.init_state(fed.initial_weights()), 0.0, None, Batteries())
    first = queue.advance()
    out = sorted(f.client_id for *_, f in queue.heap) + [f.client_id for f in first]
    assert {f.arrives_at for f in first} == {0.0}
    assert [f.client_id for f in first] == sorted(out)[:3]


@pytest.mark.parametrize(
    "sets",
    [
        ["federation.mode=async", "federation.async.concurrency=6", "federation.async.buffer_size=4"],
        ["federation.mode=deadline", "federation.deadline.late=carry"],
    ],
    ids=["fedbuff", "deadline-carry"],
)
def test_a_resumed_timed_run_equals_an_uninterrupted_one(tmp_path, sets):
    base = [*SMALL, *sets, "federation.checkpoint_every=2"]
    run_local(load_config(None, [*base, "federation.rounds=5"]), tmp_path / "straight")
    broken = tmp_path / "broken"  # "crashed" in step 4, its buffer part-filled: the last checkpoint is step 2
    run_local(load_config(None, [*base, "federation.rounds=3"]), broken)
    (broken / "checkpoints" / "round_00003.pt").unlink()
    assert checkpoint.latest(broken).pending.flights  # clients were out when it was written
    run_local(load_config(broken / "config.yaml", ["federation.rounds=5"]), broken, resume=True)
    for a, b in zip(tables(tmp_path / "straight"), tables(broken)):
        cols = [c for c in a.columns if c != "wall_time_s"]
        pd.testing.assert_frame_equal(a[cols], b[cols])


def test_the_timeline_lays_each_task_out_on_the_clock(carry_dir, async_run, tmp_path):
    for run_dir in (carry_dir, async_run[-1]):
        c, metrics = segments(run_dir)
        download = 8 * c["bytes_down"] / (c["bandwidth_mbps"] * 1e6)
        np.testing.assert_allclose(c["end"] - c["start"], c["total_s"], rtol=1e-9)
        np.testing.assert_allclose(c["upload_at"] - c["compute_at"], c["compute_s"], rtol=1e-9)
        assert (c["compute_at"] - c["start"] >= download - 1e-9).all()
        # no two tasks share a row at once (a round-based task holds its row while it waits)
        held = np.where(
            (timeline.mode(run_dir) != "async") & (c["status"] != "late"), np.maximum(c["end"], c["closes"]), c["end"]
        )
        for _, rows in c.assign(held=held).sort_values("start").groupby("slot"):
            assert (rows["start"].to_numpy()[1:] >= rows["held"].to_numpy()[:-1] - 1e-9).all()
        png = timeline.draw(run_dir, tmp_path / f"{run_dir.name}.png", "2-5")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    late = segments(carry_dir)[0].query("status == 'late'")
    assert len(late) and (late["end"] > late["closes"]).all()


def test_timeline_rounds_outside_the_run_exit_2(carry_dir, capsys):
    from rayfl.cli import main

    assert main(["timeline", str(carry_dir), "--rounds", "5-9"]) == 2
    assert capsys.readouterr().err.strip() == "rayfl: error: --rounds 5-9: the run has rounds 1-6"


def test_a_deadline_round_with_nobody_free_lasts_until_the_next_late_arrival():
    cfg = load_config(None, [*SMALL, "federation.mode=deadline", "federation.deadline.deadline_s=30"])
    fed = dataclasses.replace(build_federation(cfg), population=HandClock())
    state = fed.policy.init_state(fed.initial_weights())
    late = Late(fed, None, None)
    late.flights.append(Flight(7, 0, 0.0, 10.0, 0, False))  # every other client elsewhere: nobody selected
    out = close(fed, Dispatched(2, [], [], None, lambda: [], []), state, 5.0, late)
    assert out.row["virtual_time_s"] == 10.0 and out.row["num_clients"] == 0 and out.state.round == 2
    assert late.flights == []  # it arrived (and was dropped): free for the next round

"""Deadline and asynchronous federations on the virtual clock (rayfl/engine/deadline.py,
rayfl/engine/asynchronous.py, docs/time.md): a deadline round closed by hand numbers, the
order of events in async runs, late clients kept out while they train, and resume."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from rayfl import checkpoint, timeline
from rayfl.algorithms.messages import ClientFailure, ClientResult
from rayfl.devices import DeviceState
from rayfl.engine import build_federation
from rayfl.engine.admission import Batteries
from rayfl.engine.asynchronous import AsyncServer
from rayfl.engine.deadline import LateClients, close
from rayfl.engine.flights import Flight
from rayfl.engine.host import GroupOutcome, Settled
from rayfl.engine.round import RoundUnderway
from rayfl.load import load_config
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


def hand_federation(*sets):
    """A deadline federation on the hand clock (30 clients) and its initial state."""
    cfg = load_config(None, [*SMALL, "federation.mode=deadline", *sets])
    fed = dataclasses.replace(build_federation(cfg), population=HandClock())
    return fed, fed.policy.init_state(fed.initial_weights())


def hand_dispatch(fed, state, finish, failed=()):
    """Round 1's clients c, dispatched at 0 s, finishing at finish[c] virtual seconds, each sending
    the initial model plus c, or (those in `failed`) no update."""
    tasks = [fed.policy.task(c, 1, state.weights) for c in sorted(finish)]
    records = []
    for t in tasks:
        cost = (finish[t.client_id], 0, 0)
        if t.client_id in failed:
            records.append(Settled(ClientFailure.of(t, "diverged"), "failed", "diverged", cost))
            continue
        moved = {k: v + t.client_id if v.dtype.kind == "f" else v for k, v in state.weights.items()}
        out = ClientResult.of(t, weights=moved, num_examples=10, num_samples=10, train_loss=0.0)
        records.append(Settled(out, "ok", "", cost))
    return RoundUnderway(1, sorted(finish), tasks, None, lambda: [GroupOutcome(records, {})], [])


def hand_round(finish, *sets, failed=()):
    """Round 1 of a deadline federation (`hand_dispatch`), closed; returns it and the initial weights."""
    fed, state = hand_federation(*sets)
    return close(
        fed, hand_dispatch(fed, state, finish, failed), state, 0.0, LateClients(fed, None, None)
    ), state.weights


def first_weight(weights):
    return next(k for k in weights if k.endswith("weight"))


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


def test_a_failed_client_does_not_count_towards_the_k_updates_that_close_a_round():
    # arrivals: 1 (2 s, failed), 3 (2 s), 0 (5 s), 2 (9 s); K = 2 updates come from 3 and 0, at 5 s
    out, w0 = hand_round(FINISH, "federation.deadline.target_clients=2", failed={1})
    status = {r["client_id"]: r["status"] for r in out.clients}
    assert out.row["virtual_time_s"] == 5.0 and status == {0: "ok", 1: "failed", 2: "late", 3: "ok"}
    assert out.row["num_failed"] == 1 and out.row["num_clients"] == 2 and out.row["num_late"] == 1
    w = first_weight(w0)
    np.testing.assert_allclose(out.state.weights[w], w0[w] + 1.5, atol=1e-5)  # the mean of clients 0 and 3


@pytest.mark.parametrize("min_reports", [0, 2])
@pytest.mark.parametrize("rule, moved", [("drop", 0.0), ("carry", 4 / 2**0.5)])
def test_a_late_update_reaches_a_later_round_under_carry_only(rule, moved, min_reports):
    # K = 2: clients 1 and 3 close round 1 at 2 s; 4 (5 s) and 2 (9 s) are late. Round 2 selects
    # nobody (the hand dispatch of none) and lasts until client 4 arrives, at 5 s: under carry its
    # update, 1 version stale, joins as x1 + s(1) (x0 + 4 - x0), s(1) = (1 + 1)^-0.5; under drop the model stays.
    # A round that selected nobody is never abandoned, whatever min_reports asks of the rounds that did.
    fed, state = hand_federation(
        "federation.deadline.target_clients=2",
        f"federation.deadline.late={rule}",
        f"federation.deadline.min_reports={min_reports}",
    )
    late = LateClients(fed, None, None)
    first = close(fed, hand_dispatch(fed, state, {1: 2.0, 2: 9.0, 3: 2.0, 4: 5.0}), state, 0.0, late)
    second = close(fed, RoundUnderway(2, [], [], None, lambda: [], []), first.state, 2.0, late)
    w = first_weight(state.weights)
    np.testing.assert_allclose(first.state.weights[w], state.weights[w] + 2.0, atol=1e-5)
    assert second.row["virtual_time_s"] == 5.0 and second.row["num_carried"] == (rule == "carry")
    assert not first.row["abandoned"] and not second.row["abandoned"]
    np.testing.assert_allclose(second.state.weights[w], state.weights[w] + 2.0 + moved, atol=1e-5)
    assert [f.client_id for f in late.flights] == [2]


@pytest.mark.parametrize(
    "k, over, selected",
    [(10, 0.3, 13), (10, 0.25, 13), (3, 0.5, 5), (4, 0.5, 6)],  # 12.5 and 4.5 round up (floor and round() go down)
)
def test_over_selection_selects_k_times_one_plus_o_rounded_up(tmp_path, k, over, selected):
    cfg = load_config(
        None,
        [
            *SMALL,
            "federation.rounds=1",
            "federation.mode=deadline",
            f"federation.deadline.target_clients={k}",
            f"federation.deadline.over_selection={over}",
        ],
    )
    assert cfg.federation.deadline.selected(k) == selected
    run_local(cfg, tmp_path)  # the deadline scheduler passes that number to the policy's `select`
    assert pd.read_parquet(tmp_path / "metrics.parquet")["num_selected"].tolist() == [selected]


@pytest.mark.parametrize(
    "min_reports, failed, abandoned, moved",
    [(0, (), False, 2.0), (2, (), False, 2.0), (3, (), True, 0.0), (2, {1}, True, 0.0)],  # a failure is no update
)
def test_a_round_with_fewer_updates_on_time_than_min_reports_is_abandoned(min_reports, failed, abandoned, moved):
    # K = 3, deadline 4 s: only clients 1 and 3 (2 s) are on time; the round closes at the deadline
    out, w0 = hand_round(
        FINISH,
        "federation.deadline.target_clients=3",
        "federation.deadline.deadline_s=4",
        f"federation.deadline.min_reports={min_reports}",
        failed=failed,
    )
    rows = {r["client_id"]: r for r in out.clients}
    assert out.row["virtual_time_s"] == 4.0 and out.row["abandoned"] == abandoned and out.state.round == 1
    on_time = {c: "failed" if c in failed else "abandoned" if abandoned else "ok" for c in (1, 3)}
    assert {c: r["status"] for c, r in rows.items()} == {0: "late", 2: "late", **on_time}
    assert out.row["num_clients"] == (0 if abandoned else 2) and out.row["num_late"] == 2
    for c in (1, 3):  # charged and waiting as any client on time
        assert rows[c]["total_s"] == 2.0 and rows[c]["wait_s"] == 2.0
    assert ("fewer than federation.deadline.min_reports" in rows[3]["reason"]) == abandoned
    w = first_weight(w0)
    np.testing.assert_allclose(out.state.weights[w], w0[w] + moved, atol=1e-5)


ABANDONS = [
    "federation.mode=deadline",
    "federation.deadline.late=carry",
    "federation.deadline.deadline_s=0.25",
    "federation.deadline.min_reports=9",
]
"""Deadline rounds of 13 clients of which 7 to 10 are on time: those with fewer than 9 abandoned."""


def test_an_abandoned_round_keeps_the_model_and_records_its_clients(tmp_path):
    run_local(load_config(None, [*SMALL, *ABANDONS, "federation.rounds=6", "federation.eval_every=1"]), tmp_path)
    metrics, clients = tables(tmp_path)
    sent = clients[clients["status"].isin(["ok", "abandoned"])]
    on_time = sent.groupby("round").size().reindex(metrics["round"], fill_value=0)
    assert metrics["abandoned"].tolist() == (on_time < 9).tolist()  # the rule, round by round
    assert metrics["abandoned"].any() and not metrics["abandoned"].all()  # both kinds of round occur here
    dropped = metrics[metrics["abandoned"]]
    assert (dropped["num_clients"] == 0).all() and (dropped["num_carried"] == 0).all()
    assert dropped["round_time_s"].tolist() == pytest.approx([0.25] * len(dropped))  # each waited out its deadline
    assert dropped["num_discarded"].sum() > 0 and (metrics.loc[~metrics["abandoned"], "num_discarded"] == 0).all()
    kept = clients[clients["round"].isin(dropped["round"])]
    assert (
        set(kept["status"]) == {"abandoned", "late"} and (kept.loc[kept["status"] == "abandoned", "total_s"] > 0).all()
    )
    assert metrics["num_abandoned"].tolist() == (on_time * metrics["abandoned"].to_numpy()).tolist()
    accuracy = metrics.set_index("round")["test_accuracy"]
    for r in dropped["round"]:  # no server step: the model evaluated is the previous round's
        if r > 1:
            assert accuracy[r] == accuracy[r - 1]
    assert (metrics.loc[~metrics["abandoned"], "num_clients"] >= 9).all()


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
    queue = AsyncServer(
        fed, InProcessExecutor(fed), fed.policy.init_state(fed.initial_weights()), 0.0, None, Batteries()
    )
    first = queue.advance()
    out = sorted(f.client_id for *_, f in queue.heap) + [f.client_id for f in first]
    assert {f.arrives_at for f in first} == {0.0}
    assert [f.client_id for f in first] == sorted(out)[:3]


@pytest.mark.parametrize(
    "sets",
    [
        ["federation.mode=async", "federation.async.concurrency=6", "federation.async.buffer_size=4"],
        ["federation.mode=deadline", "federation.deadline.late=carry"],
        ABANDONS,
    ],
    ids=["fedbuff", "deadline-carry", "deadline-abandons"],
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
    late = LateClients(fed, None, None)
    late.flights.append(Flight(7, 0, 0.0, 10.0, 0, False))  # every other client elsewhere: nobody selected
    out = close(fed, RoundUnderway(2, [], [], None, lambda: [], []), state, 5.0, late)
    assert out.row["virtual_time_s"] == 10.0 and out.row["num_clients"] == 0 and out.state.round == 2
    assert late.flights == []  # it arrived (and was dropped): free for the next round

"""Typical split FL end to end in-process: learning, bytes and FLOPs on the virtual clock."""

import numpy as np
import pandas as pd
import pytest

from rayfl.config import ConfigError
from rayfl.load import load_config
from rayfl.runner import run_local
from tests.algorithms.tiny import aggregated


def test_sfl_learns_and_counts_features_gradients_and_bottom_models(tmp_path):
    cfg = load_config(
        None, ["algorithm.name=sfl", "algorithm.tau=10", "model.name=cnn2", "federation.rounds=4", "federation.lr=0.05"]
    )
    summary = run_local(cfg, tmp_path)
    assert summary["final_test_accuracy"] > 0.6  # chance is 0.1
    clients = pd.read_parquet(tmp_path / "clients.parquet")
    # cnn2 cut after its two convs: bottom = (1*25*32 + 32) + (32*25*64 + 64) = 52,096 float32 = 208,384 bytes;
    # features 64 x 2 x 2 float32 = 1,024 bytes a sample; 10 iterations of batch 10 = 100 samples.
    assert (clients["num_samples"] == 100).all()
    assert (clients["bytes_down"] == 208_384 + 100 * 1_024).all()  # bottom model + gradients
    assert (clients["bytes_up"] == 208_384 + 100 * (1_024 + 8)).all()  # bottom model + features + int64 labels
    # Only the bottom's FLOPs count for the worker: conv1 2*32*25*64 = 102,400 and conv2 (at 4x4)
    # 2*64*32*25*16 = 1,638,400 forward; training 3x, less conv1's input gradient = 5,120,000 a sample.
    assert (clients["flops"] == 100 * 5_120_000).all()


def test_merged_features_also_learn(tmp_path):
    # One top step per iteration on all 10 workers' features (10x fewer top steps than unmerged).
    cfg = load_config(
        None,
        [
            "algorithm.name=sfl",
            "algorithm.merge_features=true",
            "model.name=cnn2",
            "federation.rounds=4",
            "federation.lr=0.05",
        ],
    )
    run_local(cfg, tmp_path)
    acc = pd.read_parquet(tmp_path / "metrics.parquet")["test_accuracy"]
    assert acc.iloc[-1] > 0.45 and acc.iloc[-1] > acc.iloc[0] + 0.2  # chance is 0.1


def test_split_algorithms_need_a_split_model(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"model.name: sfl needs a model with a split point \(alexnet, cnn1d, cnn2, cnn_h, cnn_s, vgg16\)",
    ):
        run_local(load_config(None, ["algorithm.name=sfl", "model.name=mlp"]), tmp_path)


def test_the_emulated_clock_paces_split_rounds(tmp_path):
    # Unpaced, a round here takes about 0.4 s of wall time for about 2 s of virtual time; at
    # clock_scale 0.5 each round must last at least half its virtual duration.
    scale = 0.5
    sets = [
        "algorithm.name=mergesfl",
        "model.name=cnn2",
        "federation.rounds=3",
        "clock=emulate",
        f"clock_scale={scale}",
    ]
    run_local(load_config(None, sets), tmp_path)
    m = pd.read_parquet(tmp_path / "metrics.parquet")
    assert len(m) == 3 and (m["round_time_s"] > 1.0).all()
    # Rounds run one after another, each held for its scaled virtual duration from the start of its exchange; a
    # row is written when its round is recorded (evaluation overlaps the next dispatch), so the
    # guarantee shows in the cumulative wall time, not in the gaps between rows.
    assert (m["wall_time_s"] >= scale * m["round_time_s"].cumsum()).all()


def test_the_emulated_clock_holds_a_split_round_from_the_start_of_its_exchange(tmp_path, monkeypatch):
    # The previous round's evaluation (made slow here) runs between a round's dispatch and its
    # exchange; it must not count toward the hold: from the start of its exchange to its
    # settling, each round lasts at least its scaled virtual duration.
    import time

    from rayfl import runner
    from rayfl.engine import loop, scheduler

    scale, spans = 0.3, {}
    exchange, settle_round, evaluate = runner.InProcessExecutor.exchange, scheduler.settle_round, loop.evaluate

    def timed_exchange(self, tasks, driver):
        spans[tasks[0].round] = [time.perf_counter()]
        return exchange(self, tasks, driver)

    def timed_settle(fed, state, d, virtual_time_s):
        out = settle_round(fed, state, d, virtual_time_s)
        spans[d.round].append(time.perf_counter())
        return out

    def slow_evaluate(fed, outcome):
        time.sleep(1.0)  # longer than a round's scaled virtual duration (about 0.6 s)
        return evaluate(fed, outcome)

    monkeypatch.setattr(runner.InProcessExecutor, "exchange", timed_exchange)
    monkeypatch.setattr(scheduler, "settle_round", timed_settle)
    monkeypatch.setattr(loop, "evaluate", slow_evaluate)
    run_local(
        load_config(
            None,
            [
                "algorithm.name=mergesfl",
                "model.name=cnn2",
                "federation.rounds=3",
                "clock=emulate",
                f"clock_scale={scale}",
            ],
        ),
        tmp_path,
    )
    m = pd.read_parquet(tmp_path / "metrics.parquet").set_index("round")
    assert sorted(spans) == [1, 2, 3]
    for rnd, (start, end) in spans.items():
        assert end - start >= scale * m.loc[rnd, "round_time_s"], rnd


def test_a_session_error_fails_the_rounds_workers_and_a_driver_error_ends_the_run(tmp_path, monkeypatch):
    # The in-process runner draws the line where Ray does: a session's call that raises is a
    # failed actor call (every worker of the round fails, the run goes on); the driver runs in the
    # coordinator, so its own error ends the run.
    from rayfl.algorithms import split

    cfg = load_config(
        None,
        [
            "algorithm.name=sfl",
            "model.name=cnn2",
            "federation.rounds=2",
            "algorithm.tau=2",
            "federation.clients_per_round=3",
        ],
    )
    forward = split.SplitSession.forward

    def link_down_in_round_1(self):
        if self.task.round == 1:
            raise RuntimeError("link down")
        return forward(self)

    monkeypatch.setattr(split.SplitSession, "forward", link_down_in_round_1)
    run_local(cfg, tmp_path / "session")
    clients = pd.read_parquet(tmp_path / "session" / "clients.parquet")
    first, second = clients[clients["round"] == 1], clients[clients["round"] == 2]
    assert (
        len(first) == 3
        and (first["status"] == "failed").all()
        and (first["reason"] == "exchange failed: RuntimeError: link down").all()
    )
    assert len(second) == 3 and (second["status"] == "ok").all()
    monkeypatch.setattr(split.SplitSession, "forward", forward)

    def broken_top(self, features, labels):
        raise ValueError("top model broke")

    monkeypatch.setattr(split.TopServer, "step", broken_top)
    with pytest.raises(ValueError, match="top model broke"):
        run_local(cfg, tmp_path / "driver")


def test_bottoms_are_averaged_weighted_by_the_samples_they_processed():
    # Eq. 17: w_b = sum_i d_i tau w_b,i / sum_i d_i tau (d_i tau = samples processed); the top is
    # the server's. Workers with 10 and 30 samples send bottoms of constant 1 and 5: mean 4.
    from rayfl.algorithms.messages import ClientResult
    from rayfl.engine import build_federation

    fed = build_federation(load_config(None, ["algorithm.name=sfl", "model.name=cnn2"]))
    policy, state = fed.policy, fed.policy.init_state(fed.initial_weights())
    results = [
        ClientResult(
            client_id=c,
            round=1,
            weights={k: np.full_like(state.weights[k], v) for k in policy.bottom_keys},
            num_examples=50,
            num_samples=n,
            train_loss=0.0,
        )
        for c, v, n in ((0, 1.0, 10), (1, 5.0, 30))
    ]
    new = aggregated(policy, state, 1, results)
    for k in policy.bottom_keys:
        assert np.allclose(new.weights[k], (10 * 1.0 + 30 * 5.0) / 40)  # 4.0, not the plain mean 3.0
    for k in policy.top_keys:
        assert np.array_equal(new.weights[k], state.weights[k])

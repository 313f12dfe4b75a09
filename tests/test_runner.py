"""The in-process runner end to end: accuracy, determinism, the virtual clock, rejected updates."""

import dataclasses
import json
import math
import time

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.engine import build_federation, prepare, run_federation, run_round, torch_threads
from rayfl.load import load_config, parse_config
from rayfl.metrics import METRICS_COLUMNS, SUMMARY_KEYS
from rayfl.runner import InProcessExecutor, run_local


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("default")
    summary = run_local(load_config(None), run_dir)
    return run_dir, summary


def test_fedavg_on_digits_reaches_90_percent(default_run):
    run_dir, summary = default_run
    assert summary["final_test_accuracy"] >= 0.90
    assert {p.name for p in run_dir.iterdir()} >= {"config.yaml", "metrics.parquet", "clients.parquet", "summary.json"}
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    assert list(metrics.columns[: len(METRICS_COLUMNS)]) == list(METRICS_COLUMNS)
    assert metrics["round"].tolist() == list(range(1, 31))
    assert (metrics["virtual_time_s"].diff().dropna() > 0).all()
    assert set(SUMMARY_KEYS) <= set(json.loads((run_dir / "summary.json").read_text()))
    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert len(clients) == 30 * 10 and (clients["status"] == "ok").all()
    assert (clients.groupby("round")["bytes_up"].sum().values == metrics["bytes_up"].values).all()


def test_same_seed_gives_identical_tables(tmp_path):
    cfg = load_config(None, ["federation.rounds=4"])
    tables = []
    for name in ("a", "b"):
        run_local(cfg, tmp_path / name)
        tables.append([pd.read_parquet(tmp_path / name / f) for f in ("metrics.parquet", "clients.parquet")])
    (m1, c1), (m2, c2) = tables
    pd.testing.assert_frame_equal(m1.drop(columns="wall_time_s"), m2.drop(columns="wall_time_s"))
    pd.testing.assert_frame_equal(c1, c2)
    other = tmp_path / "c"
    run_local(cfg.model_copy(update={"seed": 1}), other)
    assert not pd.read_parquet(other / "metrics.parquet")["test_accuracy"].equals(m1["test_accuracy"])


def test_virtual_clock_of_a_round_matches_the_cost_model_by_hand(tmp_path):
    profile = tmp_path / "two.yaml"
    profile.write_text(
        "name: two\nclasses:\n"
        "  - {name: slow, proportion: 1, flops: [1.0e+8], memory_mb: 64, bandwidth_mbps: [2, 2], latency_ms: 0}\n"
        "  - {name: fast, proportion: 1, flops: [1.0e+9], memory_mb: 64, bandwidth_mbps: [20, 20], latency_ms: 50}\n"
    )
    cfg = parse_config(
        {
            "data": {"num_clients": 4, "partition": {"kind": "iid"}},
            "model": {"name": "mlp", "hidden": [16]},
            "federation": {"clients_per_round": 4, "rounds": 1, "local_epochs": 2, "batch_size": 50},
            "devices": {"profile": str(profile)},
        }
    )
    with torch_threads():
        fed = build_federation(cfg)
        state = fed.policy.init_state(fed.initial_weights())
        out = run_round(fed, state, 1, InProcessExecutor(fed), virtual_time_s=100.0)
    # MLP 64 -> 16 -> 10: 64*16 + 16 + 16*10 + 10 = 1210 float32 parameters = 4840 bytes each way.
    # Training FLOPs per sample: forward 2*(64*16 + 16*10) = 2368; backward 2 x that minus the first layer's
    # input gradient (2*64*16 = 2048): 3 * 2368 - 2048 = 5056.
    times = []
    for row in out.clients:
        size = fed.clients.sizes()[row["client_id"]]
        assert row["num_samples"] == 2 * size  # two epochs
        slow = row["device"] == "slow"
        compute = 5056 * 2 * size / (1e8 if slow else 1e9)
        comm = 8 * 2 * 4840 / (2e6 if slow else 20e6) + (0.0 if slow else 0.1)
        assert row["compute_s"] == pytest.approx(compute) and row["comm_s"] == pytest.approx(comm)
        times.append(compute + comm)
    assert out.row["round_time_s"] == pytest.approx(max(times))
    assert out.row["virtual_time_s"] == pytest.approx(100.0 + max(times))
    assert out.row["mean_wait_s"] == pytest.approx(np.mean([max(times) - t for t in times]))
    assert out.row["bytes_up"] == out.row["bytes_down"] == 4 * 4840


class PoisonOne(InProcessExecutor):
    """Client 0 ends its training with NaN weights (as a diverged client's), its losses finite:
    the loop finds them on the device."""

    def __init__(self, fed):
        super().__init__(fed)
        final = fed.procedure.final

        def poisoned(task, state, ctx):
            trained = final(task, state, ctx)
            if task.client_id == 0:
                with torch.no_grad():
                    for t in trained.weights.values():
                        t.fill_(float("nan")) if t.is_floating_point() else None
            return trained

        fed.procedure.final = poisoned


def test_non_finite_updates_are_rejected_and_recorded(tmp_path):
    cfg = parse_config(
        {"data": {"num_clients": 4}, "model": {"name": "mlp"}, "federation": {"clients_per_round": 4, "rounds": 2}}
    )
    with torch_threads():
        fed, start = prepare(cfg, tmp_path)
        summary = run_federation(fed, PoisonOne(fed), tmp_path, start)
    metrics, clients = pd.read_parquet(tmp_path / "metrics.parquet"), pd.read_parquet(tmp_path / "clients.parquet")
    assert (
        metrics["num_rejected"].tolist() == [1, 1]
        and metrics["num_failed"].tolist() == [0, 0]
        and metrics["num_clients"].tolist() == [3, 3]
    )
    assert set(clients.loc[clients.client_id == 0, "status"]) == {"rejected"}
    assert clients.loc[clients.client_id == 0, "reason"].str.contains("non-finite").all()
    assert math.isfinite(summary["final_test_accuracy"]) and summary["final_test_accuracy"] > 0.3


@pytest.mark.parametrize("name", ["fedprox", "fedadam", "fedyogi", "fedadagrad"])
def test_each_algorithm_trains_in_process(tmp_path, name):
    extra = {"fedprox": {"mu": 0.01}}.get(name, {"server_lr": 0.01})
    cfg = parse_config(
        {
            "algorithm": {"name": name, **extra},
            "model": {"name": "mlp"},
            "data": {"partition": {"kind": "iid"}},
            "federation": {"rounds": 6, "eval_every": 3},
        }
    )
    summary = run_local(cfg, tmp_path)
    acc = pd.read_parquet(tmp_path / "metrics.parquet")["test_accuracy"]
    assert acc.isna().tolist() == [True, True, False, True, True, False]  # evaluated every 3 rounds
    assert acc[5] > acc[2] and summary["final_test_accuracy"] > 0.6  # chance is 0.1


class Recording(InProcessExecutor):
    """Keeps the hold the engine hands over, and the groups' outcomes."""

    def submit(self, groups, *, sums, hold_s=None):
        collect = super().submit(groups, sums=sums, hold_s=hold_s)
        self.hold_s = hold_s

        def keep():
            self.outcomes = collect()
            return self.outcomes

        return keep


def test_emulate_paces_each_client_by_its_policys_cost(tmp_path):
    # A policy whose client_cost differs from the model's FLOPs x samples: the pace follows the policy.
    from rayfl.algorithms.capabilities import ClientAccount, train_cost
    from rayfl.algorithms.fedavg import FedAvgPolicy

    class Heavier(FedAvgPolicy):
        def client_cost(self, task, result):
            flops, down, up = train_cost(self.context, task, result)
            return 3 * flops, down + 1000, up

    # Two groups of two clients (ray.clients_per_call 2): a group's host is held for the sum of its
    # clients' scaled virtual times.
    cfg = parse_config(
        {
            "data": {"num_clients": 4},
            "model": {"name": "mlp", "hidden": [8]},
            "federation": {"clients_per_round": 4, "rounds": 1},
            "clock": "emulate",
            "clock_scale": 1e-3,
            "ray": {"clients_per_call": 2},
        }
    )
    with torch_threads():
        fed = build_federation(cfg)
        heavier = Heavier(cfg, fed.context)
        fed = dataclasses.replace(fed, policy=heavier, account=ClientAccount.of(heavier))
        executor = Recording(fed)
        out = run_round(fed, fed.policy.init_state(fed.initial_weights()), 1, executor, 0.0)
    rows = {r["client_id"]: r for r in out.clients}
    for row in out.clients:
        assert row["flops"] == 3 * fed.cost_of(cfg.model).train_flops * row["num_samples"]
    assert len(executor.outcomes) == 2
    for group in executor.outcomes:
        ids = [s.outcome.client_id for s in group.settled]
        assert executor.hold_s(group) == pytest.approx(1e-3 * sum(rows[c]["total_s"] for c in ids))


def test_the_in_process_executor_holds_each_task_to_its_pace():
    cfg = parse_config(
        {
            "data": {"num_clients": 4},
            "model": {"name": "mlp", "hidden": [8]},
            "federation": {"clients_per_round": 2, "rounds": 1},
        }
    )
    with torch_threads():
        fed = build_federation(cfg)
        tasks = fed.policy.configure(fed.policy.init_state(fed.initial_weights()), 1, [0, 1])
        start = time.perf_counter()
        InProcessExecutor(fed).submit([[tasks[0]], [tasks[1]]], sums=False, hold_s=lambda group: 0.25)()
    assert time.perf_counter() - start >= 0.5


def test_a_diverged_client_is_failed_and_charged_for_what_it_did(tmp_path):
    # lr 1e6: every client's loss goes non-finite after a step or two. It downloaded the model and
    # trained until then: that compute and those bytes are on the clock; it uploads nothing.
    cfg = load_config(None, ["federation.lr=1e6", "federation.rounds=3", "model.name=mlp"])
    run_local(cfg, tmp_path)
    metrics, clients = pd.read_parquet(tmp_path / "metrics.parquet"), pd.read_parquet(tmp_path / "clients.parquet")
    assert (clients["status"] == "failed").all() and (clients["reason"] == "non-finite training loss").all()
    fed = build_federation(cfg)
    cost = fed.cost_of(cfg.model)
    n = clients["client_id"].map(dict(enumerate(fed.clients.sizes())))
    assert (clients["num_samples"] > 0).all() and (clients["num_samples"] <= n).all()  # failed within its one epoch
    assert np.allclose(clients["flops"], cost.train_flops * clients["num_samples"])
    assert (clients["bytes_down"] == cost.param_bytes).all() and (clients["bytes_up"] == 0).all()
    assert (clients["compute_s"] > 0).all() and metrics["round_time_s"].tolist() == clients.groupby("round")[
        "total_s"
    ].max().tolist()
    # Rounds with no update are rounds: recorded, evaluated, the global model unchanged.
    assert metrics["num_clients"].tolist() == [0, 0, 0] and metrics["num_failed"].tolist() == [10, 10, 10]
    assert metrics["test_accuracy"].nunique() == 1 and metrics["bytes_up"].tolist() == [0, 0, 0]


@pytest.mark.parametrize("partition", ["{kind: dirichlet, min_size: 0}", "{kind: iid}"])
def test_clients_with_nothing_or_one_sample_to_train(tmp_path, partition):
    # 2,000 clients on digits' 1,347 training samples: some hold none (skipped, said so, free on
    # the clock), some one (batch norm cannot train on it: failed, with the error). Under iid no
    # client holds more than one, so no round has an update, and every round is still a round.
    cfg = load_config(None, ["data.num_clients=2000", f"data.partition={partition}", "federation.rounds=3"])
    run_local(cfg, tmp_path)
    metrics, clients = pd.read_parquet(tmp_path / "metrics.parquet"), pd.read_parquet(tmp_path / "clients.parquet")
    sizes = dict(enumerate(build_federation(cfg).clients.sizes()))
    n = clients["client_id"].map(sizes)
    assert (clients.loc[n == 0, "status"] == "skipped").all() and (
        clients.loc[n == 0, "reason"] == "no training samples"
    ).all()
    assert (clients.loc[n == 0, "bytes_down"].isna()).all()  # declined at once: no download, no time
    assert (clients.loc[n == 1, "status"] == "failed").all()
    assert clients.loc[n == 1, "reason"].str.startswith("ValueError: Expected more than 1 value per channel").all()
    assert (clients.loc[n > 1, "status"] == "ok").all()
    assert (n == 0).any() and (n == 1).any()
    assert (
        metrics["round"].tolist() == [1, 2, 3]
        and (
            metrics["num_skipped"] == clients.groupby("round")["status"].apply(lambda s: (s == "skipped").sum()).values
        ).all()
    )
    if partition == "{kind: iid}":
        assert metrics["num_clients"].tolist() == [0, 0, 0] and metrics["test_accuracy"].nunique() == 1

"""Ditto: the personal step on a hand problem, v_k kept per client, FedAvg's global model, the
cost, and personalization on clients' own test data."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.algorithms import registry
from rayfl.algorithms.ditto import DittoTask, personal_step
from rayfl.algorithms.local import LocalState
from rayfl.algorithms.messages import ClientResult
from rayfl.engine import build_federation, run_round, torch_threads
from rayfl.evaluate import Evaluator
from rayfl.load import load_config, parse_config
from rayfl.models import ModelCache
from rayfl.runner import InProcessExecutor, run_local
from tests.algorithms.tiny import TinyClients, aggregated, context, linear


def policy(ctx, **algorithm):
    return registry.get("ditto").policy(
        parse_config({"algorithm": {"name": "ditto", **algorithm}, "model": {"name": "mlp", "hidden": []}}), ctx
    )


def test_personal_step_is_the_proximal_sgd_step():
    # Prepare: v = (W, b) of a 1 -> 2 linear model, w^t = (W0, b0), one sample x = 2 of class 1.
    W, b, W0, b0 = np.array([[0.3], [-0.2]]), np.array([0.1, 0.0]), np.array([[0.5], [0.5]]), np.array([0.0, -1.0])
    x, y, lr, lam = 2.0, 1, 0.5, 0.1
    model = torch.nn.Linear(1, 2, dtype=torch.float64)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(W))
        model.bias.copy_(torch.tensor(b))
    v = LocalState(
        model, torch.optim.SGD(model.parameters(), lr=lr), {"weight": torch.tensor(W0), "bias": torch.tensor(b0)}
    )
    # Execute
    loss = personal_step(v, (torch.tensor([[x]], dtype=torch.float64), torch.tensor([y])), lam)
    # Assert: v <- v - lr (grad F(v) + lam (v - w^t)), grad of CE = (softmax - e_y) [x, 1].
    z = W[:, 0] * x + b
    p = np.exp(z) / np.exp(z).sum()
    err = p - np.eye(2)[y]
    np.testing.assert_allclose(model.weight.detach().numpy(), W - lr * (err[:, None] * x + lam * (W - W0)), rtol=1e-12)
    np.testing.assert_allclose(model.bias.detach().numpy(), b - lr * (err + lam * (b - b0)), rtol=1e-12)
    prox = ((W - W0) ** 2).sum() + ((b - b0) ** 2).sum()
    assert loss == pytest.approx(-np.log(p[y]) + lam / 2 * prox, rel=1e-12)


def result(cid, w, n, personal):
    return ClientResult(
        client_id=cid,
        round=1,
        weights={"w": np.array(w, np.float32)},
        num_examples=n,
        num_samples=n,
        train_loss=0.0,
        keep={"personal": {"w": np.array(personal, np.float32)}},
    )


def test_personal_models_persist_per_client_and_are_not_averaged():
    pol = policy(context())
    state = pol.init_state({"w": np.array([0.0], np.float32)})
    # Round 1: v_k starts as the global model; w^1 is FedAvg's mean, each v_k kept as returned.
    first = pol.configure(state, 1, [0, 1])
    assert all(t.personal is state.weights for t in first)
    state = aggregated(pol, state, 1, [result(0, [1.0], 10, [7.0]), result(1, [5.0], 30, [9.0])])
    assert state.weights["w"].tolist() == [4.0]  # (10 * 1 + 30 * 5) / 40
    assert state.clients[0]["w"].tolist() == [7.0] and state.clients[1]["w"].tolist() == [9.0]
    # Round 2: client 0 gets its own v_0, client 2 (never selected) the current global model.
    second = {t.client_id: t for t in pol.configure(state, 2, [0, 2])}
    assert second[0].personal["w"].tolist() == [7.0]
    assert second[2].personal is state.weights
    state = aggregated(pol, state, 2, [result(0, [4.0], 10, [8.0])])
    assert state.clients[0]["w"].tolist() == [8.0] and state.clients[1]["w"].tolist() == [9.0]  # client 1 untouched


def test_client_cost_counts_both_models_but_only_the_global_ones_bytes():
    pol = policy(context(cost_of=lambda variant: SimpleNamespace(train_flops=3.0)))
    w = {"w": np.zeros(4, np.float32)}
    task = pol.task(0, 1, w, kind=DittoTask, personal={"w": np.zeros(100, np.float32)})
    flops, down, up = pol.client_cost(
        task,
        ClientResult(
            client_id=0,
            round=1,
            weights=w,
            num_examples=5,
            num_samples=10,
            train_loss=0.0,
            keep={"personal": task.personal},
        ),
    )
    assert (flops, down, up) == (2 * 3.0 * 10, 16, 16)


SMALL = ["data.num_clients=6", "federation.clients_per_round=3", "federation.rounds=1"]


def one_round(name):
    with torch_threads():
        fed = build_federation(load_config(None, [f"algorithm.name={name}", *SMALL]))
        state = fed.policy.init_state(fed.initial_weights())
        return fed, run_round(fed, state, 1, InProcessExecutor(fed), 0.0).state


def test_the_global_model_is_fedavgs_and_each_client_keeps_its_own_v():
    _, fedavg = one_round("fedavg")
    fed, ditto = one_round("ditto")
    assert fedavg.weights.keys() == ditto.weights.keys()
    for k in fedavg.weights:
        np.testing.assert_array_equal(ditto.weights[k], fedavg.weights[k], err_msg=k)
    selected = fed.policy.select(ditto, 1, range(6), fed.policy.config.federation.clients_per_round)
    assert sorted(ditto.clients) == selected
    for k in fed.context.param_names:  # v_k differ from client to client and from w
        assert not np.array_equal(ditto.clients[selected[0]][k], ditto.clients[selected[1]][k]), k
        assert not np.array_equal(ditto.clients[selected[0]][k], ditto.weights[k]), k


def test_personalize_scores_each_clients_own_v_and_the_global_model_for_the_unselected():
    # Rows 0-1 are client 0's (labels 1, 1), rows 2-3 client 1's (labels 1, 0); x = 1 everywhere.
    clients = TinyClients([1, 1, 1, 1], [1, 1, 1, 0], {0: ([1], [1]), 1: ([1], [0])})
    pol = policy(context((1, 1), test_split=(np.array([0, 1]), np.array([2, 3]))))
    evaluator = Evaluator(clients, ModelCache((1,), 2), 100, 10)
    global_w = linear([1, 0], [0, 0])  # predicts class 0: client 0 0/2, client 1 1/2
    state = pol.init_state(global_w).replace(clients={0: linear([0, 1], [0, 0])})  # v_0 predicts class 1: 2/2
    out = pol.personalize(state, 1, evaluator)
    assert out["initial_accuracy"] == pytest.approx((0.0 + 0.5) / 2)
    assert out["personal_accuracy"] == pytest.approx((1.0 + 0.5) / 2)  # client 1 never selected: v_1 = w
    assert out["personal_accuracy_std"] == pytest.approx(0.25)


def test_two_rounds_on_shards_report_finite_personal_accuracy(tmp_path):
    cfg = load_config(
        None,
        [
            "algorithm.name=ditto",
            "data.num_clients=5",
            "federation.clients_per_round=3",
            "federation.rounds=2",
            "data.partition.kind=shards",
            "federation.personalize_epochs=1",
        ],
    )
    run_local(cfg, tmp_path)
    metrics = pd.read_parquet(tmp_path / "metrics.parquet")
    assert len(metrics) == 2
    assert np.isfinite(metrics[["initial_accuracy", "personal_accuracy"]].to_numpy()).all()

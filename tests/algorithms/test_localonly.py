"""Local-only: per-client models that persist and never mix, no bytes, own-model evaluation."""

import math
from types import SimpleNamespace

import numpy as np
import pytest

from rayfl.algorithms.localonly import LocalOnlyPolicy
from rayfl.algorithms.messages import ClientResult, FederationContext
from rayfl.algorithms.personal import client_test_indices
from rayfl.engine import ClientRunner, build_federation, run_round, torch_threads
from rayfl.load import load_config, parse_config
from rayfl.runner import InProcessExecutor
from tests.algorithms.tiny import aggregated


def context():
    return FederationContext(
        0,
        3,
        2,
        (2,),
        np.array([10, 30, 5]),
        lambda: np.zeros((3, 2)),
        frozenset({"w"}),
        np.full(3, 2**30),
        None,
        cost_of=lambda variant: SimpleNamespace(train_flops=7.0),
    )


def result(cid, w, n):
    return ClientResult(
        client_id=cid, round=1, weights={"w": np.array(w, np.float32)}, num_examples=n, num_samples=n, train_loss=0.0
    )


def test_each_client_keeps_its_own_model_and_new_clients_start_from_w0():
    policy = LocalOnlyPolicy(parse_config({"algorithm": {"name": "localonly"}}), context())
    state = policy.init_state({"w": np.array([0.0, 0.0], np.float32)})
    state = aggregated(policy, state, 1, [result(0, [1, 2], 10), result(1, [5, 6], 30)])
    assert state.clients[0]["w"].tolist() == [1.0, 2.0]  # not (10 [1, 2] + 30 [5, 6]) / 40
    assert state.clients[1]["w"].tolist() == [5.0, 6.0]
    assert state.weights["w"].tolist() == [0.0, 0.0]  # w_0 never moves
    tasks = policy.configure(state, 2, [0, 2])
    assert tasks[0].weights["w"].tolist() == [1.0, 2.0]  # its own w_0 -> w_1
    assert tasks[1].weights["w"].tolist() == [0.0, 0.0]  # first selection: w_0
    state = aggregated(policy, state, 2, [result(0, [3, 3], 10)])
    assert state.clients[0]["w"].tolist() == [3.0, 3.0] and state.clients[1]["w"].tolist() == [5.0, 6.0]


def test_no_bytes_travel_only_flops():
    policy = LocalOnlyPolicy(parse_config({"algorithm": {"name": "localonly"}}), context())
    task = policy.configure(policy.init_state({"w": np.zeros(4, np.float32)}), 1, [0])[0]
    assert policy.client_cost(task, result(0, [1, 2, 3, 4], 6)) == (7.0 * 6, 0, 0)  # train_flops x samples


def test_after_two_rounds_a_client_holds_its_continued_training_not_an_average():
    small = [
        "data.num_clients=2",
        "federation.clients_per_round=2",
        "federation.local_epochs=1",
        "federation.batch_size=64",
    ]
    fed = build_federation(load_config(None, ["algorithm.name=localonly", "model.name=mlp", *small]))
    state = fed.policy.init_state(fed.initial_weights())
    executor = InProcessExecutor(fed)
    runner = ClientRunner.of(fed)
    alone = {c: fed.initial_weights() for c in (0, 1)}
    with torch_threads():
        for rnd in (1, 2):
            state = run_round(fed, state, rnd, executor, 0.0).state
        for rnd in (1, 2):  # each client trained on its own, one round after the other
            alone = {c: runner.run_all([fed.policy.task(c, rnd, alone[c])])[0].weights for c in (0, 1)}
    for c in (0, 1):
        for k, v in alone[c].items():
            np.testing.assert_array_equal(state.clients[c][k], v)
    assert not np.allclose(state.clients[0]["1.weight"], state.clients[1]["1.weight"])


def test_accuracy_is_each_trained_clients_own_model_on_its_own_test_rows():
    cfg = load_config(
        None,
        [
            "algorithm.name=localonly",
            "model.name=mlp",
            "model.hidden=[]",
            "data.num_clients=4",
            "federation.clients_per_round=2",
        ],
    )
    fed = build_federation(cfg)
    w0 = fed.initial_weights()
    y = fed.evaluator.y.numpy()

    def always(label):  # a linear model that predicts `label` for every input
        bias = np.zeros_like(w0["1.bias"])
        bias[label] = 10.0
        return {"1.weight": np.zeros_like(w0["1.weight"]), "1.bias": bias}

    state = fed.policy.init_state(w0).replace(clients={0: always(3), 2: always(5)})
    hist = fed.context.label_histogram()
    share = [np.mean(y[client_test_indices(None, hist, y, c)] == label) for c, label in ((0, 3), (2, 5))]
    out = fed.policy.evaluate(state, 1, fed.evaluator)
    assert out["test_accuracy"] == pytest.approx(np.mean(share))  # client 1 and 3 never trained: not counted
    personal = fed.policy.personalize(state, 1, fed.evaluator)
    assert personal["personal_accuracy"] == pytest.approx(np.mean(share))
    assert personal["personal_accuracy_std"] == pytest.approx(np.std(share))
    assert math.isnan(personal["initial_accuracy"])

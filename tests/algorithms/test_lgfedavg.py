"""LG-FedAvg: FedAvg over the global layers only, local bodies per client, global-layer bytes."""

from types import SimpleNamespace

import numpy as np
import pytest

from rayfl.algorithms import aggregate
from rayfl.algorithms.capabilities import ClientAccount
from rayfl.algorithms.lgfedavg import LGFedAvgPolicy, global_keys
from rayfl.algorithms.messages import ClientResult, FederationContext
from rayfl.config import ConfigError
from rayfl.engine import build_federation, run_round, torch_threads
from rayfl.load import load_config, parse_config
from rayfl.models import build_model
from rayfl.runner import InProcessExecutor
from tests.algorithms.tiny import aggregated

MLP = {"algorithm": {"name": "lgfedavg"}, "model": {"name": "mlp", "hidden": [3]}}
"""Flatten, Linear(2, 3) as `1.*` (the body), ReLU, Linear(3, 2) as `5.*` (the global layer)."""


def context():
    return FederationContext(
        0,
        3,
        2,
        (2,),
        np.array([10, 30, 5]),
        lambda: np.zeros((3, 2)),
        frozenset({"1.weight", "1.bias", "5.weight", "5.bias"}),
        np.full(3, 2**30),
        None,
        cost_of=lambda variant: SimpleNamespace(train_flops=1.0),
    )


def hand(body, top, bias):
    return (
        {"1.weight": np.full((3, 2), body, np.float32), "1.bias": np.full(3, body, np.float32)},
        {"5.weight": np.full((2, 3), top, np.float32), "5.bias": np.array(bias, np.float32)},
    )


def trained(cid, n, body, top, bias):
    """A result as the engine hands it to a summing policy: theta^l_k kept, theta^g_k summed away."""
    b, t = hand(body, top, bias)
    return ClientResult(
        client_id=cid, round=1, weights=t, num_examples=n, num_samples=n, train_loss=0.0, keep={"body": b}
    )


def test_global_keys_are_the_last_weight_layers():
    mlp = build_model(parse_config(MLP).model, (2,), 2)
    assert global_keys(mlp, 1) == {"5.weight", "5.bias"}
    assert global_keys(mlp, 2) == {"1.weight", "1.bias", "5.weight", "5.bias"}
    with pytest.raises(ConfigError, match="global_layers"):
        global_keys(mlp, 3)
    cnn = build_model(parse_config({}).model, (1, 8, 8), 10)  # ... conv 15, batch norm 17, ..., linear 21
    assert global_keys(cnn, 2) == {"15.weight", "15.bias", "21.weight", "21.bias"}  # the norm between stays local


def test_aggregate_averages_only_the_global_layers_sample_weighted_and_keeps_each_body():
    policy = LGFedAvgPolicy(parse_config(MLP), context())
    b0, t0 = hand(0.0, 0.0, [0, 0])
    state = policy.init_state({**b0, **t0})
    results = [trained(0, 10, 7.0, 1.0, [1, 2]), trained(1, 30, 9.0, 5.0, [5, 6])]
    summands = [policy.summand(r) for r in results]
    assert set(summands[0]) == {"5.weight", "5.bias", aggregate.WEIGHT}  # no body in the sum
    state = policy.aggregate(state, 1, results, aggregate.add_up(summands))
    np.testing.assert_allclose(state.weights["5.weight"], np.full((2, 3), (10 * 1.0 + 30 * 5.0) / 40))
    np.testing.assert_allclose(state.weights["5.bias"], (10 * np.array([1, 2]) + 30 * np.array([5, 6])) / 40)
    assert (state.weights["1.weight"] == 0).all() and (state.weights["1.bias"] == 0).all()  # theta^l_0 unchanged
    assert (state.clients[0]["1.weight"] == 7).all() and (state.clients[1]["1.weight"] == 9).all()
    assert set(state.clients[0]) == {"1.weight", "1.bias"}


def test_the_body_persists_per_client_and_only_global_bytes_travel():
    policy = LGFedAvgPolicy(parse_config(MLP), context())
    b0, t0 = hand(0.0, 0.0, [0, 0])
    state = aggregated(policy, policy.init_state({**b0, **t0}), 1, [trained(0, 10, 7.0, 1.0, [1, 2])])
    old, new = policy.configure(state, 2, [0, 2])
    assert (old.body["1.weight"] == 7).all()  # client 0's own theta^l_0 from round 1
    assert (new.body["1.weight"] == 0).all()  # a first selection starts from theta^l_0
    assert set(old.weights) == {"5.weight", "5.bias"} and old.weights["5.bias"].tolist() == [1.0, 2.0]
    _, up = hand(3.0, 3.0, [3, 3])
    _, down_bytes, up_bytes = ClientAccount.of(policy).cost(
        old,
        ClientResult(
            client_id=0, round=2, weights=up, num_examples=10, num_samples=10, train_loss=0.0, keep={"body": b0}
        ),
    )
    assert (down_bytes, up_bytes) == (
        (2 * 3 + 2) * 4,
        (2 * 3 + 2) * 4,
    )  # float32 Linear(3, 2); the body's 36 bytes stay


def test_two_rounds_on_digit_shards_give_personal_accuracy():
    cfg = load_config(
        None,
        [
            "algorithm.name=lgfedavg",
            "data.partition.kind=shards",
            "federation.personalize_epochs=1",
            "federation.local_epochs=1",
        ],
    )
    fed = build_federation(cfg)
    state = fed.policy.init_state(fed.initial_weights())
    executor = InProcessExecutor(fed)
    with torch_threads():
        for rnd in (1, 2):
            out = run_round(fed, state, rnd, executor, 0.0)
            state = out.state
    assert np.isfinite([out.row["personal_accuracy"], out.row["initial_accuracy"], out.row["test_accuracy"]]).all()
    head = 4 * (512 * 10 + 10)  # float32 Linear(512, 10) of the cnn: all that travels
    assert {c["bytes_up"] for c in out.clients} == {head} and {c["bytes_down"] for c in out.clients} == {head}
    first, second, *_ = sorted(state.clients)
    assert set(state.clients[first]) == set(state.weights) - {"21.weight", "21.bias"}
    assert not np.array_equal(state.clients[first]["0.weight"], state.clients[second]["0.weight"])  # a body per client

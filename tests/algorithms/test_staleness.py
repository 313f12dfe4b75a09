"""FedAsync's mixing and FedBuff's staleness-weighted buffer on hand tensors, each from its
paper's equation (rayfl/algorithms/staleness.py), through the policy's own aggregate."""

import numpy as np
import pytest

from rayfl.algorithms import aggregate
from rayfl.algorithms.fedavg import FedAvgPolicy
from rayfl.algorithms.messages import ClientResult
from rayfl.algorithms.staleness import carried, fedasync, fedbuff, weight
from rayfl.config import StalenessConfig
from rayfl.load import load_config

from .tiny import aggregated, context


@pytest.mark.parametrize(
    "kind, a, b, staleness, expected",
    [
        ("constant", 0.5, 4, 7, 1.0),
        ("polynomial", 0.5, 4, 0, 1.0),  # FedBuff: 1 / sqrt(1 + 0)
        ("polynomial", 0.5, 4, 3, 0.5),  # 1 / sqrt(1 + 3)
        ("polynomial", 2.0, 4, 1, 0.25),  # (1 + 1)^-2
        ("hinge", 10.0, 4, 4, 1.0),  # within b
        ("hinge", 10.0, 4, 5, 1 / 11),  # one step past b: 1 / (10 (5 - 4) + 1)
        ("hinge", 10.0, 4, 6, 1 / 21),  # 1 / (10 (6 - 4) + 1)
    ],
)
def test_staleness_weights_follow_xie_et_al(kind, a, b, staleness, expected):
    assert weight(staleness, StalenessConfig(kind=kind, a=a, b=b)) == pytest.approx(expected, rel=1e-12)


def policy_for(*sets):
    config = load_config(None, ["model.name=mlp", *sets])
    return FedAvgPolicy(config, context()), config.federation


def result(client, w, n, b=0.0):
    return ClientResult(
        client_id=client,
        round=1,
        weights={"w": np.array(w, np.float32), "b": np.array([b], np.float32)},
        num_examples=n,
        num_samples=n,
        train_loss=0.0,
    )


def test_fedasync_mixes_the_new_model_in_by_alpha_times_s():
    # x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new, alpha_t = 0.5 * s(3) = 0.5 * (3 + 1)^-0.5 = 0.25
    policy, fed = policy_for("federation.mode=async", "federation.async.rule=fedasync", "federation.async.mixing=0.5")
    state = policy.init_state({"w": np.array([1.0, 2.0], np.float32), "b": np.array([4.0], np.float32)})
    # FedAsync mixes models: the model the client started from plays no part
    mixed = fedasync(result(1, [3.0, 6.0], 10, b=8.0), state.weights, 3, fed.staleness, fed.asynchronous.mixing)
    new = aggregated(policy, state, 1, [mixed])
    np.testing.assert_array_equal(new.weights["w"], np.array([1.5, 3.0], np.float32))
    np.testing.assert_array_equal(new.weights["b"], np.array([5.0], np.float32))  # mixed alike: a convex combination
    assert new.round == 1


@pytest.mark.parametrize("server_lr, expected", [(1.0, [1.0, 1.0]), (0.5, [0.5, 0.5])])
def test_fedbuff_steps_by_the_mean_of_staleness_scaled_deltas(server_lr, expected):
    # x + eta (1/K) sum_i s_i Delta_i with x = 0: A's Delta (2, 0) fresh (s = 1), B's (0, 4) three
    # steps old (s = 1/2): eta (2 + 0, 0 + 2) / 2. Their sizes (10 and 30) play no part.
    policy, fed = policy_for("federation.mode=async", f"algorithm.server_lr={server_lr}")
    state = policy.init_state({"w": np.zeros(2, np.float32), "b": np.zeros(1, np.float32)})
    a = fedbuff(
        result(0, [3.0, 1.0], 10, b=2.0),
        {"w": np.ones(2, np.float32), "b": np.zeros(1)},
        state.weights,
        0,
        fed.staleness,
        {"w"},
    )
    b = fedbuff(
        result(1, [0.0, 4.0], 30, b=4.0),
        {"w": np.zeros(2, np.float32), "b": np.zeros(1)},
        state.weights,
        3,
        fed.staleness,
        {"w"},
    )
    new = aggregated(policy, state, 1, [a, b])
    np.testing.assert_allclose(new.weights["w"], expected, rtol=0, atol=1e-7)
    # buffers (batch-norm statistics) are not moved by deltas: the clients' own values, averaged
    np.testing.assert_array_equal(new.weights["b"], np.array([3.0], np.float32))


def test_a_carried_deadline_update_keeps_its_weight_among_the_fresh_ones():
    # deadline, late: carry: x + s Delta with FedAvg's n_k: (10 * 2 + 30 * (0 + 0.5 * 4)) / 40 on the second entry
    policy, fed = policy_for("federation.mode=deadline", "federation.deadline.late=carry")
    state = policy.init_state({"w": np.zeros(2, np.float32), "b": np.zeros(1, np.float32)})
    fresh = result(0, [0.0, 2.0], 10)
    late = carried(
        result(1, [0.0, 4.0], 30),
        {"w": np.zeros(2, np.float32), "b": np.zeros(1)},
        state.weights,
        3,
        fed.staleness,
        {"w"},
    )
    assert late.num_examples == 30
    new = aggregated(policy, state, 1, [fresh, late])
    np.testing.assert_allclose(new.weights["w"], [0.0, (10 * 2 + 30 * 2) / 40], atol=1e-7)


def test_a_sub_model_update_moves_the_current_models_leading_block():
    current = {"w": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)}
    start, update = {"w": np.array([[0.0]], np.float32)}, {"w": np.array([[2.0]], np.float32)}
    np.testing.assert_array_equal(aggregate.rebase(current, start, update, 0.5, {"w"})["w"], [[2.0]])  # 1 + 0.5 (2 - 0)
    np.testing.assert_array_equal(
        aggregate.mix(current, {"w": np.array([[3.0]], np.float32)}, 0.25)["w"], [[1.5]]
    )  # 0.75 + 0.75

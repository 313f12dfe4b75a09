"""FedAdam / FedYogi / FedAdagrad / FedAvg(M) steps against Reddi et al. Alg. 2 by hand."""

import math

import numpy as np
import pytest

from rayfl.algorithms import server_opt

X = {"w": np.array([1.0, 2.0])}
D1 = {"w": np.array([0.1, -0.2])}
D2 = {"w": np.array([-0.3, 0.4])}
ETA, B1, B2, TAU = 0.1, 0.9, 0.99, 1e-3


def test_fedadam_two_steps_by_hand():
    state = server_opt.init("adam", X, eta=ETA, beta1=B1, beta2=B2, tau=TAU)
    state, x1 = server_opt.apply(state, X, D1)
    # m1 = 0.1 * D1 ; v1 = 0.99 * tau^2 + 0.01 * D1^2
    m1 = [0.01, -0.02]
    v1 = [0.99e-6 + 0.01 * 0.01, 0.99e-6 + 0.01 * 0.04]
    want1 = [1.0 + 0.1 * m1[0] / (math.sqrt(v1[0]) + TAU), 2.0 + 0.1 * m1[1] / (math.sqrt(v1[1]) + TAU)]
    assert x1["w"] == pytest.approx(want1, rel=1e-12)
    state, x2 = server_opt.apply(state, x1, D2)
    m2 = [0.9 * m1[0] + 0.1 * -0.3, 0.9 * m1[1] + 0.1 * 0.4]
    v2 = [0.99 * v1[0] + 0.01 * 0.09, 0.99 * v1[1] + 0.01 * 0.16]
    want2 = [want1[i] + 0.1 * m2[i] / (math.sqrt(v2[i]) + TAU) for i in range(2)]
    assert x2["w"] == pytest.approx(want2, rel=1e-12)
    assert state.t == 2


def test_fedyogi_and_fedadagrad_second_moments_by_hand():
    for kind, v1 in (
        # Yogi: v1 = tau^2 - 0.01 * D^2 * sign(tau^2 - D^2) = tau^2 + 0.01 D^2 since D^2 > tau^2
        ("yogi", [1e-6 + 0.01 * 0.01, 1e-6 + 0.01 * 0.04]),
        # Adagrad: v1 = tau^2 + D^2
        ("adagrad", [1e-6 + 0.01, 1e-6 + 0.04]),
    ):
        state = server_opt.init(kind, X, eta=ETA, beta1=B1, beta2=B2, tau=TAU)
        state, x1 = server_opt.apply(state, X, D1)
        assert state.v["w"] == pytest.approx(v1, rel=1e-12)
        want = [1.0 + 0.1 * 0.01 / (math.sqrt(v1[0]) + TAU), 2.0 + 0.1 * -0.02 / (math.sqrt(v1[1]) + TAU)]
        assert x1["w"] == pytest.approx(want, rel=1e-12)


def test_yogi_shrinks_v_when_it_exceeds_the_new_square():
    state = server_opt.init("yogi", X, eta=ETA, beta1=B1, beta2=B2, tau=TAU)
    big = {"w": np.array([1.0, 1.0])}
    state, _ = server_opt.apply(state, X, big)  # v = 1e-6 + 0.01
    state, _ = server_opt.apply(state, X, {"w": np.array([0.0, 0.0])})  # D^2 = 0 < v: v - 0.01 * 0 -> unchanged
    assert state.v["w"] == pytest.approx([1e-6 + 0.01] * 2)


def test_fedavg_is_sgd_with_unit_rate_and_fedavgm_keeps_momentum():
    state = server_opt.init("sgd", X, eta=1.0)
    _, x1 = server_opt.apply(state, X, D1)
    assert x1["w"] == pytest.approx([1.1, 1.8])
    state = server_opt.init("sgd", X, eta=0.5, beta1=0.9)
    state, x1 = server_opt.apply(state, X, D1)  # m1 = D1
    state, x2 = server_opt.apply(state, x1, D2)  # m2 = 0.9 D1 + D2 = [-0.21, 0.22]
    assert x2["w"] == pytest.approx([1.0 + 0.05 - 0.105, 2.0 - 0.1 + 0.11])

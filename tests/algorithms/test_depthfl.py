"""DepthFL (Kim et al. 2023) as FeDepth's paper runs it: depth from the memory budget, the
self-distillation loss and its ramp-up, FedDyn's client and server steps, layer-wise aggregation
over holders, the prefix's head as the global auxiliary classifier, the ensemble's accuracy,
and two rounds on digits under FeDepth's Fair budgets. Expected values are computed here from
the formulas, on hand-made numbers."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.algorithms.depthfl import (
    dyn_state_update,
    ensemble_scores,
    exit_logits,
    feddyn_penalty,
    feddyn_server,
    fitting_depth,
    global_name,
    rampup,
    self_distillation_loss,
)
from rayfl.algorithms.messages import ClientResult
from rayfl.engine import build_federation
from rayfl.load import load_config
from rayfl.models import build_model
from rayfl.runner import run_local
from tests.algorithms.tiny import aggregated

FAIR = [
    "algorithm.name=depthfl",
    "devices.profile=fedepth_fair",
    "data.num_clients=8",
    "federation.clients_per_round=4",
]


def federation(*extra):
    return build_federation(load_config(None, [*FAIR, *extra]))


def initial(policy, ctx, value=None):
    model = build_model(policy.global_model(), ctx.input_shape, ctx.num_classes)
    return {
        k: v.numpy() if value is None else np.full(v.shape, value, np.float32) for k, v in model.state_dict().items()
    }


# --------------------------------------------------------------------------- depth from budget


def test_fitting_depth_takes_the_deepest_prefix_that_fits():
    need = {3: 10.0, 6: 20.0, 9: 30.0}.__getitem__
    assert fitting_depth([3, 6, 9], need, 25.0) == 6  # between depth 6 and depth 9: the shorter
    assert fitting_depth([3, 6, 9], need, 20.0) == 6  # exactly its memory fits
    assert fitting_depth([3, 6, 9], need, 30.0) == 9
    assert fitting_depth([3, 6, 9], need, 9.99) == 0  # fits none: sits out


def test_depths_under_fair_budgets_and_who_is_selected():
    fed = federation()
    policy, ctx = fed.policy, fed.context
    cfg = fed.config
    need = lambda d: ctx.cost_of(cfg.model.model_copy(update={"depth": d})).training_memory(
        cfg.federation.batch_size, 0
    )
    assert policy.exits == (2, 5, 8) and policy.global_model().aux_heads == "3-6"
    assert fitting_depth([3, 6, 9], need, (need(3) + need(6)) / 2) == 3
    budgets = ctx.memory_bytes
    # The full-width budget is the full model's own memory: depth 9. The 1/6-width one holds not even depth 3.
    assert budgets.max() == need(9) and budgets.min() < need(3)
    for c in range(8):
        expect = 9 if budgets[c] >= need(9) else 6 if budgets[c] >= need(6) else 3 if budgets[c] >= need(3) else 0
        assert policy.client_depths[c] == expect
    eligible = set(np.flatnonzero(policy.client_depths > 0).tolist())
    assert 0 < len(eligible) < 8
    for rnd in range(1, 6):
        assert set(policy.select(None, rnd, range(8), policy.config.federation.clients_per_round)) <= eligible


# --------------------------------------------------------------------------- local loss


def np_softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_self_distillation_loss_on_hand_logits():
    z = [
        np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]),
        np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0]]),
        np.array([[0.0, 3.0, 0.0], [1.0, 0.0, 2.0]]),
    ]
    y = np.array([0, 2])
    w = 0.4

    def ce(zi):
        return float(np.mean(-np.log(np_softmax(zi)[np.arange(2), y])))

    def kl(zj, zi):  # KL(softmax(z_j) || softmax(z_i)), target probabilities + 1e-7, batch mean
        p = np_softmax(zj) + 1e-7
        return float(np.mean((p * (np.log(p) - np.log(np_softmax(zi)))).sum(1)))

    expect = sum(ce(z[i]) + w / 2 * sum(kl(z[j], z[i]) for j in range(3) if j != i) for i in range(3))
    logits = [torch.tensor(a, requires_grad=True) for a in z]
    loss = self_distillation_loss(logits, torch.tensor(y), w)
    assert float(loss.detach()) == pytest.approx(expect, rel=1e-6)
    assert float(self_distillation_loss(logits, torch.tensor(y), 0.0).detach()) == pytest.approx(
        sum(ce(a) for a in z), rel=1e-6
    )
    assert float(self_distillation_loss(logits[:1], torch.tensor(y), w).detach()) == pytest.approx(
        ce(z[0]), rel=1e-6
    )  # K = 1: CE alone
    # Targets are detached: with two exits, z_1's gradient is its CE's, (p_1 - onehot) / N, plus
    # w d KL(p_2 || p_1) / d z_1 = w (p_1 sum(p_2) - p_2) / N (p_2 with its 1e-7), and nothing of
    # KL(p_1 || p_2), where z_1 is the target.
    a = torch.tensor(z[0], requires_grad=True)
    b = torch.tensor(z[1], requires_grad=True)
    self_distillation_loss([a, b], torch.tensor(y), w).backward()
    p1, p2 = np_softmax(z[0]), np_softmax(z[1]) + 1e-7
    onehot = np.eye(3)[y]
    np.testing.assert_allclose(
        a.grad.numpy(), (p1 - onehot) / 2 + w * (p1 * p2.sum(1, keepdims=True) - p2) / 2, rtol=1e-5
    )


def test_rampup_values():
    assert rampup(0, 300) == pytest.approx(math.exp(-5.0))
    assert rampup(150, 300) == pytest.approx(math.exp(-5.0 * 0.25))
    assert rampup(300, 300) == 1.0 and rampup(1000, 300) == 1.0
    assert rampup(5, 0) == 1.0


def test_configure_sends_the_rounds_weight_and_the_prefix():
    fed = federation("algorithm.kd_rampup_rounds=10")
    policy, ctx = fed.policy, fed.context
    state = policy.init_state(initial(policy, ctx))
    shallow = int(np.flatnonzero(policy.client_depths == 3)[0])
    (task,) = policy.configure(state, 6, [shallow])  # t = 5 of T = 10
    assert task.kd_weight == pytest.approx(math.exp(-5.0 * 0.25)) and task.model.depth == 3
    assert not any(k.startswith(("layers.3.", "aux.")) for k in task.weights)
    np.testing.assert_array_equal(task.weights["head.linear.weight"], state.weights["aux.2.linear.weight"])
    (off,) = federation("algorithm.kd=false").policy.configure(state, 6, [shallow])
    assert off.kd_weight == 0.0


def test_the_prefix_head_is_the_global_auxiliary_classifier():
    # The depth-3 and depth-6 prefixes, loaded from the global weights, give the same logits as
    # the global model's classifiers after layers 3 and 6 (no ReLU on an auxiliary head).
    fed = federation()
    policy, ctx = fed.policy, fed.context
    with torch.random.fork_rng():
        torch.manual_seed(0)
        glob = build_model(policy.global_model(), ctx.input_shape, ctx.num_classes)
        for p in glob.parameters():
            torch.nn.init.normal_(p)  # biases and norm shifts nonzero, so a stray ReLU shows
        x = torch.randn(5, *ctx.input_shape)
    weights = {k: v.numpy() for k, v in glob.state_dict().items()}
    with torch.no_grad():
        full = exit_logits(glob, x)
        for depth, n in ((3, 1), (6, 2)):
            local = build_model(policy.variants[depth], ctx.input_shape, ctx.num_classes)
            local.load_state_dict({k: torch.tensor(v) for k, v in policy.prefix(weights, depth).items()})
            for a, b in zip(exit_logits(local, x), full[:n]):
                torch.testing.assert_close(a, b)
    assert (
        global_name("head.linear.bias", 3, 9) == "aux.2.linear.bias"
        and global_name("head.linear.bias", 9, 9) == "head.linear.bias"
    )


# --------------------------------------------------------------------------- FedDyn


def test_feddyn_client_penalty_gradient_and_state_update():
    theta = torch.tensor([1.0, -2.0], requires_grad=True)
    glob, g = torch.tensor([0.5, 0.0]), torch.tensor([0.3, -0.1])
    alpha = 0.1
    pen = feddyn_penalty({"w": theta}, {"w": glob}, {"w": g}, alpha)
    # -<theta, g> + alpha/2 ||theta - glob||^2 = -(0.3 + 0.2) + 0.05 (0.25 + 4)
    assert float(pen.detach()) == pytest.approx(-0.5 + 0.05 * 4.25)
    pen.backward()
    np.testing.assert_allclose(
        theta.grad.numpy(), [-0.3 + 0.1 * 0.5, 0.1 + 0.1 * -2.0], rtol=1e-6
    )  # -g + alpha (theta - glob)
    # grad_prev <- grad_prev - alpha (theta - theta_glob)
    out = dyn_state_update(
        {"w": torch.tensor([0.3, -0.1])},
        {"w": torch.tensor([1.0, -2.0]), "buf": torch.tensor([9.0])},
        {"w": torch.tensor([0.5, 0.0])},
        alpha,
    )
    assert list(out) == ["w"] and out["w"].dtype == torch.float64
    np.testing.assert_allclose(out["w"].numpy(), [0.3 - 0.1 * 0.5, -0.1 - 0.1 * -2.0], rtol=1e-6)


def test_feddyn_server_step_on_hand_tensors():
    old = {
        "w": np.array([1.0, 2.0], np.float32),
        "bn.mean": np.array([0.0], np.float32),
        "far": np.array([7.0], np.float32),
    }
    mean = {
        "w": np.array([3.0, 2.0], np.float32),
        "bn.mean": np.array([0.4], np.float32),
        "far": np.array([7.0], np.float32),
    }
    h = {"w": np.array([0.5, 0.0]), "far": np.array([0.2])}
    theta, h_new = feddyn_server(old, mean, {"w": 2.0, "bn.mean": 2.0}, h, alpha=0.1, num_clients=10)
    # h <- h - alpha (n / N)(mean - old) = [0.5 - 0.02 * 2, 0 - 0.02 * 0]; theta = mean - h / alpha.
    np.testing.assert_allclose(h_new["w"], [0.46, 0.0])
    np.testing.assert_allclose(theta["w"], [3.0 - 4.6, 2.0], rtol=1e-6)
    assert theta["w"].dtype == np.float32
    assert theta["bn.mean"] == pytest.approx(0.4)  # a buffer: the mean, no correction
    assert theta["far"] == 7.0 and h_new["far"] == 0.2  # held by nobody: value and h unchanged


# --------------------------------------------------------------------------- aggregation


def test_layerwise_mean_over_holders_and_kept_state():
    fed = federation("algorithm.feddyn=false")
    policy, ctx = fed.policy, fed.context
    state = policy.init_state(initial(policy, ctx, -9.0))
    shallow, deep = int(np.flatnonzero(policy.client_depths == 3)[0]), int(np.flatnonzero(policy.client_depths == 9)[0])

    def result(c, value):
        (task,) = policy.configure(state, 1, [c])
        return ClientResult(
            client_id=c,
            round=1,
            weights={k: np.full_like(v, value) for k, v in task.weights.items()},
            num_examples=50,
            num_samples=50,
            train_loss=0.0,
        )

    def values(st, prefix):
        return sorted({float(v) for k, a in st.weights.items() if k.startswith(prefix) for v in np.ravel(a)})

    new = aggregated(policy, state, 1, [result(shallow, 1.0), result(deep, 3.0)])
    assert values(new, "stem.") == [2.0] and values(new, "layers.2.") == [2.0]  # both hold them: (1 + 3) / 2
    assert values(new, "aux.2.") == [2.0]  # the shallow client's head is aux.2
    assert (
        values(new, "layers.3.") == [3.0] and values(new, "aux.5.") == [3.0] and values(new, "head.") == [3.0]
    )  # the deep one alone
    alone = aggregated(policy, state, 1, [result(shallow, 1.0)])
    assert values(alone, "layers.2.") == [1.0] and values(alone, "aux.2.") == [1.0]
    assert (
        values(alone, "layers.3.") == [-9.0] and values(alone, "head.") == [-9.0] and values(alone, "aux.5.") == [-9.0]
    )  # nobody held them


def test_feddyn_through_the_policy():
    fed = federation()
    policy, ctx = fed.policy, fed.context
    state = policy.init_state(initial(policy, ctx, 0.0))
    deep = int(np.flatnonzero(policy.client_depths == 9)[0])
    (task,) = policy.configure(state, 1, [deep])
    assert task.feddyn and task.grad_prev is None
    grad_prev = {k: np.full(np.shape(v), 0.5) for k, v in task.weights.items() if k in ctx.param_names}
    result = ClientResult(
        client_id=deep,
        round=1,
        weights={k: np.full_like(v, 1.0) for k, v in task.weights.items()},
        num_examples=50,
        num_samples=50,
        train_loss=0.0,
        keep={"grad_prev": grad_prev},
    )
    new = aggregated(policy, state, 1, [result])
    # One holder of N = 8: h = -0.1 * (1/8) * (1 - 0) = -0.0125; theta = 1 - h / 0.1 = 1.125.
    np.testing.assert_allclose(new.opt_state["stem.conv.weight"], -0.0125)
    np.testing.assert_allclose(new.weights["stem.conv.weight"], 1.125, rtol=1e-6)
    assert new.clients[deep] == grad_prev
    (again,) = policy.configure(new, 2, [deep])
    assert again.grad_prev == grad_prev


# --------------------------------------------------------------------------- evaluation and a run


def test_ensemble_accuracy_is_the_accuracy_of_the_mean_logits():
    a = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])  # predicts 0, 1, 1
    b = torch.tensor([[0.0, 1.0], [3.0, 0.0], [0.0, 1.0]])  # predicts 1, 0, 1
    y = torch.tensor([0, 0, 1])
    out = ensemble_scores([a, b], y, [3, 9])
    # Mean logits [[1, .5], [1.5, .5], [0, 2]] predict 0, 0, 1: all right, though each exit gets 2 of 3.
    assert out["test_accuracy"] == 1.0
    assert out["test_accuracy@exit3"] == pytest.approx(2 / 3) and out["test_accuracy@exit9"] == pytest.approx(2 / 3)
    mean = ((a + b) / 2).numpy()
    assert out["test_loss"] == pytest.approx(
        float(np.mean(-np.log(np_softmax(mean)[np.arange(3), y.numpy()]))), rel=1e-6
    )


def test_two_rounds_on_digits_under_fair_budgets(tmp_path):
    cfg = load_config(None, [*FAIR, "federation.rounds=2", "federation.local_epochs=1"])
    run_local(cfg, tmp_path)
    m = pd.read_parquet(tmp_path / "metrics.parquet")
    assert len(m) == 2 and np.isfinite(m["test_accuracy"]).all()
    for k in (3, 6, 9):
        assert np.isfinite(m[f"test_accuracy@exit{k}"]).all()
    c = pd.read_parquet(tmp_path / "clients.parquet")
    assert (c["status"] == "ok").all() and set(c["depth"]) == {3.0, 9.0}
    assert (c["bytes_down"][c["depth"] == 3] < c["bytes_down"][c["depth"] == 9].min()).all()  # only the prefix travels

"""FedAvg / FedProx / FedAdam policies and client procedures on tiny inputs."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rayfl.algorithms import registry
from rayfl.algorithms.local import ClientContext
from rayfl.algorithms.messages import ClientResult, ClientTask, FederationContext
from rayfl.load import parse_config
from rayfl.models import ModelCache
from rayfl.optim import OptimizerSpec
from tests.algorithms.tiny import aggregated


def context(param_names=("w",)):
    return FederationContext(
        0,
        4,
        2,
        (2,),
        np.array([10, 30, 5, 5]),
        lambda: np.zeros((4, 2)),
        frozenset(param_names),
        np.full(4, 2**30),
        None,
        cost_of=None,
    )


def result(cid, w, n, extra=None):
    return ClientResult(
        client_id=cid,
        round=1,
        weights={"w": np.array(w, np.float32), **(extra or {})},
        num_examples=n,
        num_samples=n,
        train_loss=0.0,
    )


def test_fedavg_aggregate_is_the_sample_weighted_mean():
    cfg = parse_config({"algorithm": {"name": "fedavg"}})
    policy = registry.get("fedavg").policy(cfg, context())
    state = policy.init_state({"w": np.array([0.0, 0.0], np.float32), "running": np.array([1.0], np.float32)})
    new = aggregated(
        policy,
        state,
        1,
        [
            result(0, [1, 2], 10, {"running": np.array([2.0], np.float32)}),
            result(1, [5, 6], 30, {"running": np.array([6.0], np.float32)}),
        ],
    )
    assert new.weights["w"].tolist() == [4.0, 5.0]  # (10 * [1, 2] + 30 * [5, 6]) / 40
    assert new.weights["running"].tolist() == [5.0]  # buffers: the same weighted mean
    assert new.round == 1


def test_fedavg_server_lr_scales_the_pseudo_gradient():
    cfg = parse_config({"algorithm": {"name": "fedavg", "server_lr": 0.5}})
    policy = registry.get("fedavg").policy(cfg, context())
    state = policy.init_state({"w": np.array([2.0, 2.0], np.float32)})
    new = aggregated(policy, state, 1, [result(0, [4, 0], 1)])
    assert new.weights["w"].tolist() == [3.0, 1.0]  # x + 0.5 (x_k - x)


def test_fedadam_policy_applies_adam_to_the_mean_delta():
    cfg = parse_config({"algorithm": {"name": "fedadam", "server_lr": 0.1, "tau": 0.01}})
    policy = registry.get("fedadam").policy(cfg, context())
    state = policy.init_state({"w": np.array([0.0], np.float32)})
    new = aggregated(policy, state, 1, [result(0, [1.0], 1), result(1, [3.0], 1)])
    delta = 2.0
    m, v = 0.1 * delta, 0.99 * 1e-4 + 0.01 * delta**2
    assert new.weights["w"][0] == pytest.approx(0.1 * m / (np.sqrt(v) + 0.01), rel=1e-6)


def test_selection_is_a_pure_function_of_seed_and_round():
    cfg = parse_config({"data": {"num_clients": 4}, "federation": {"clients_per_round": 2}})
    policy = registry.get("fedavg").policy(cfg, context())
    state = policy.init_state({"w": np.zeros(1, np.float32)})
    picks = [tuple(policy.select(state, r, [0, 1, 2, 3], 2)) for r in range(1, 30)]
    assert picks == [tuple(policy.select(state, r, [0, 1, 2, 3], 2)) for r in range(1, 30)]
    assert all(len(set(p)) == 2 for p in picks) and len(set(picks)) > 3
    assert policy.select(state, 5, [2], 2) == [2]


def test_fedprox_loss_adds_the_proximal_term():
    cfg = parse_config({"algorithm": {"name": "fedprox", "mu": 0.5}, "model": {"name": "mlp", "hidden": []}})
    proc = registry.get("fedprox").procedure(cfg)
    ctx = ClientContext(0, ModelCache((2,), 2))
    task = ClientTask(
        client_id=0,
        round=1,
        weights={"1.weight": np.zeros((2, 2), np.float32), "1.bias": np.zeros(2, np.float32)},
        model=cfg.model,
        local_epochs=1,
        batch_size=2,
        optimizer=OptimizerSpec("sgd", 0.1),
    )
    state = proc.init(task, ctx)
    model = state.model
    with torch.no_grad():
        model[1].weight.fill_(1.0)  # ||w - w0||^2 = 4 (weight) + 0 (bias)
    x, y = torch.ones(1, 2), torch.tensor([1])
    logits = model(x)
    assert float(proc.loss(state, logits, y).detach()) == pytest.approx(
        float(F.cross_entropy(logits, y).detach()) + 0.5 / 2 * 4
    )

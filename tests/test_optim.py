"""One optimizer description on the task, and learning-rate schedules over rounds."""

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from rayfl import checkpoint
from rayfl.config import ConfigError
from rayfl.engine import build_federation
from rayfl.loader import load_config, parse_config
from rayfl.optim import OptimizerSpec, lr_schedule
from rayfl.runner import run_local


def schedule(rounds, **spec):
    return lr_schedule(parse_config({"federation": {"lr": 0.1, "rounds": rounds, "lr_schedule": spec}}).federation)


def test_constant_and_exponential_schedules():
    assert schedule(3, kind="constant") == [0.1, 0.1, 0.1]
    assert schedule(3, kind="exponential", gamma=0.5) == [0.1, 0.05, 0.025]
    # MergeSFL's code: lr_h = max(0.993 lr_{h-1}, 0.005).
    lrs = schedule(600, kind="exponential", gamma=0.993, min_lr=0.005)
    expected = [0.1]
    for _ in range(599):
        expected.append(max(0.993 * expected[-1], 0.005))
    assert lrs == pytest.approx(expected, rel=1e-12) and lrs[-1] == 0.005


def test_multistep_milestones_as_fractions_or_rounds():
    # Fractions of 8 rounds: the rate drops after round ceil(0.5 * 8) = 4 and after round 6.
    assert schedule(8, kind="multistep", milestones=[0.5, 0.75], gamma=0.1) == pytest.approx([0.1] * 4 + [0.01] * 2 + [0.001] * 2)
    # HeteroFL's MNIST setting: MultiStepLR([100]) over 200 rounds, stepped per round.
    lrs = schedule(200, kind="multistep", milestones=[100], gamma=0.1)
    assert lrs[99] == 0.1 and lrs[100] == pytest.approx(0.01) and lrs == schedule(200, kind="multistep", milestones=[0.5], gamma=0.1)


def test_cosine_schedule_follows_the_closed_form():
    lrs = schedule(10, kind="cosine", min_lr=0.02)
    want = [0.02 + (0.1 - 0.02) * (1 + np.cos(np.pi * t / 10)) / 2 for t in range(10)]
    assert lrs == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(
    "spec, key",
    [
        ({"kind": "multistep", "milestones": [0.5, 3]}, "federation.lr_schedule.milestones"),
        ({"kind": "multistep", "milestones": [5, 2]}, "federation.lr_schedule.milestones"),
        ({"kind": "exponential", "gamma": 1.5}, "federation.lr_schedule.gamma"),
        ({"kind": "step"}, "federation.lr_schedule.kind"),
    ],
)
def test_bad_schedules_name_the_key(spec, key):
    with pytest.raises(ConfigError, match=f"^{key}"):
        parse_config({"federation": {"lr_schedule": spec}})


def test_momentum_is_refused_with_adam():
    with pytest.raises(ConfigError, match=r"^federation.momentum: .*applies to optimizer sgd only"):
        parse_config({"federation": {"optimizer": "adam", "momentum": 0.9}})


def test_grad_clip_clips_every_step_of_a_built_optimizer():
    w = torch.nn.Parameter(torch.zeros(2))
    opt = OptimizerSpec("sgd", 1.0, grad_clip=0.5).build([w])
    w.grad = torch.tensor([3.0, 4.0])  # norm 5 -> clipped to 0.5: [0.3, 0.4]
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([-0.3, -0.4]))


def test_clients_train_at_the_scheduled_rate(tmp_path):
    # One client a round, one full batch a round, a linear model, FedAvg with eta = 1: the global
    # model after round r is w_{r-1} - lr_r * grad(w_{r-1}) on that client's data.
    sets = [
        "model.name=mlp", "model.hidden=[]", "data.num_clients=4", "data.partition.kind=iid", "federation.clients_per_round=1",
        "federation.batch_size=1000", "federation.rounds=3", "federation.checkpoint_every=1", "federation.lr=0.4",
        "federation.lr_schedule.kind=exponential", "federation.lr_schedule.gamma=0.5",
    ]
    cfg = load_config(None, sets)
    run_local(cfg, tmp_path)
    metrics, clients = pd.read_parquet(tmp_path / "metrics.parquet"), pd.read_parquet(tmp_path / "clients.parquet")
    assert metrics["lr"].tolist() == [0.4, 0.2, 0.1] and clients["lr"].tolist() == [0.4, 0.2, 0.1]
    fed = build_federation(cfg)
    weights = [fed.initial_weights()] + [checkpoint.decode(torch.load(p, weights_only=True)["state"]).weights for p in sorted((tmp_path / "checkpoints").iterdir())]
    for r, (lr, client) in enumerate(zip(metrics["lr"], clients["client_id"]), start=1):
        x, y = (torch.from_numpy(a) for a in fed.clients.train(client))
        x = x.flatten(1)
        w = torch.tensor(weights[r - 1]["1.weight"], requires_grad=True)
        b = torch.tensor(weights[r - 1]["1.bias"], requires_grad=True)
        F.cross_entropy(x @ w.T + b, y).backward()
        torch.testing.assert_close(torch.from_numpy(weights[r]["1.weight"]), (w - lr * w.grad).detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.from_numpy(weights[r]["1.bias"]), (b - lr * b.grad).detach(), rtol=1e-5, atol=1e-6)

"""One optimizer description on the task, and learning-rate schedules over rounds."""

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from rayfl import checkpoint
from rayfl.config import ConfigError
from rayfl.engine import build_federation
from rayfl.load import load_config, parse_config
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
    assert schedule(8, kind="multistep", milestones=[0.5, 0.75], gamma=0.1) == pytest.approx(
        [0.1] * 4 + [0.01] * 2 + [0.001] * 2
    )
    # HeteroFL's MNIST setting: MultiStepLR([100]) over 200 rounds, stepped per round.
    lrs = schedule(200, kind="multistep", milestones=[100], gamma=0.1)
    assert (
        lrs[99] == 0.1
        and lrs[100] == pytest.approx(0.01)
        and lrs == schedule(200, kind="multistep", milestones=[0.5], gamma=0.1)
    )


def test_cosine_schedule_follows_the_closed_form():
    lrs = schedule(10, kind="cosine", min_lr=0.02)
    want = [0.02 + (0.1 - 0.02) * (1 + np.cos(np.pi * t / 10)) / 2 for t in range(10)]
    assert lrs == pytest.approx(want, rel=1e-9)


def test_a_warm_up_rises_linearly_then_the_schedule_runs_over_the_other_rounds():
    # W = 4 of R = 10: lr r / 4 for r = 1..4, then cosine over 6 rounds from 0.1.
    cosine = [0.1 * (1 + np.cos(np.pi * t / 6)) / 2 for t in range(6)]
    assert schedule(10, kind="cosine", warmup_rounds=4) == pytest.approx([0.025, 0.05, 0.075, 0.1, *cosine], rel=1e-9)
    # FedSup Sec. 4.1: 20 warm-up rounds, then cosine from 0.1 (500 rounds)
    lrs = schedule(500, kind="cosine", warmup_rounds=20)
    assert (
        lrs[0] == pytest.approx(0.005)
        and lrs[19] == pytest.approx(0.1)
        and lrs[20] == 0.1
        and lrs[260] == pytest.approx(0.05)
    )
    # every kind takes one: a constant rate after 2 rounds of warm-up; exponential from round 3 on
    assert schedule(4, kind="constant", warmup_rounds=2) == pytest.approx([0.05, 0.1, 0.1, 0.1])
    assert schedule(5, kind="exponential", gamma=0.5, warmup_rounds=2) == pytest.approx([0.05, 0.1, 0.1, 0.05, 0.025])
    # multistep milestones are fractions of the rounds after the warm-up: 0.5 of 4 is round 2 + 2
    assert schedule(6, kind="multistep", milestones=[0.5], warmup_rounds=2) == pytest.approx(
        [0.05, 0.1, 0.1, 0.1, 0.01, 0.01]
    )


def test_a_warm_up_must_leave_rounds_to_the_schedule():
    with pytest.raises(ConfigError, match=r"^federation.lr_schedule.warmup_rounds \(5\) leaves no round"):
        parse_config({"federation": {"rounds": 5, "lr_schedule": {"kind": "cosine", "warmup_rounds": 5}}})


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


@pytest.mark.parametrize(
    "clip, step",
    [
        (0.5, [0.3, 0.4, 0.0]),  # a number is a norm: (3, 4, 0) has norm 5, scaled to 0.5
        ({"kind": "norm", "max": 0.5}, [0.3, 0.4, 0.0]),
        ({"kind": "value", "max": 1.0}, [1.0, 1.0, 0.0]),  # each entry to [-1, 1]: FedSup's code
        ({"kind": "value", "max": 3.5}, [3.0, 3.5, 0.0]),
    ],
)
def test_grad_clip_clips_every_step_of_a_built_optimizer(clip, step):
    spec = OptimizerSpec.of(parse_config({"federation": {"grad_clip": clip}}).federation, 1.0)
    w = torch.nn.Parameter(torch.zeros(3))
    opt = spec.build([w])
    for k in (1, 2):
        w.grad = torch.tensor([3.0, 4.0, 0.0])
        opt.step()
        torch.testing.assert_close(w.detach(), -k * torch.tensor(step))


@pytest.mark.parametrize(
    "warmup, lrs",
    [
        (0, [0.4, 0.2, 0.1]),
        (2, [0.2, 0.4, 0.4, 0.2]),  # 0.4 * 1/2, 0.4 * 2/2, then the exponential over the other 2 rounds
    ],
)
def test_clients_train_at_the_scheduled_rate(tmp_path, warmup, lrs):
    # One client a round, one full batch a round, a linear model, FedAvg with eta = 1: the global
    # model after round r is w_{r-1} - lr_r * grad(w_{r-1}) on that client's data.
    sets = [
        "model.name=mlp",
        "model.hidden=[]",
        "data.num_clients=4",
        "data.partition.kind=iid",
        "federation.clients_per_round=1",
        "federation.batch_size=1000",
        f"federation.rounds={len(lrs)}",
        "federation.checkpoint_every=1",
        "federation.lr=0.4",
        "federation.lr_schedule.kind=exponential",
        "federation.lr_schedule.gamma=0.5",
        f"federation.lr_schedule.warmup_rounds={warmup}",
    ]
    cfg = load_config(None, sets)
    run_local(cfg, tmp_path)
    metrics, clients = pd.read_parquet(tmp_path / "metrics.parquet"), pd.read_parquet(tmp_path / "clients.parquet")
    assert metrics["lr"].tolist() == pytest.approx(lrs, rel=1e-12) and clients["lr"].tolist() == pytest.approx(
        lrs, rel=1e-12
    )
    fed = build_federation(cfg)
    weights = [fed.initial_weights()] + [
        checkpoint.decode(torch.load(p, weights_only=True)["state"]).weights
        for p in sorted((tmp_path / "checkpoints").iterdir())
    ]
    for r, (lr, client) in enumerate(zip(metrics["lr"], clients["client_id"]), start=1):
        x, y = (torch.from_numpy(a) for a in fed.clients.train(client))
        x = x.flatten(1)
        w = torch.tensor(weights[r - 1]["1.weight"], requires_grad=True)
        b = torch.tensor(weights[r - 1]["1.bias"], requires_grad=True)
        F.cross_entropy(x @ w.T + b, y).backward()
        torch.testing.assert_close(
            torch.from_numpy(weights[r]["1.weight"]), (w - lr * w.grad).detach(), rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(
            torch.from_numpy(weights[r]["1.bias"]), (b - lr * b.grad).detach(), rtol=1e-5, atol=1e-6
        )

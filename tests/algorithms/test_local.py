"""The one client loop (`rayfl.algorithms.local`): what it makes of a procedure's device values,
read back once after the last step, and the run's precision."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from rayfl.algorithms.base import ClientProcedure
from rayfl.algorithms.local import NON_FINITE, LocalState, Trained
from rayfl.algorithms.messages import ClientFailure, ClientResult
from rayfl.engine import ClientRunner, build_federation
from rayfl.load import load_config
from rayfl.runner import run_local


class Scripted(ClientProcedure):
    """Steps that train nothing and return the losses of a script, one a step, as device tensors."""

    def __init__(self, config, losses):
        super().__init__(config)
        self.losses = list(losses)

    def init(self, task, ctx):
        return LocalState(ctx.load(task.model, task.weights), None)

    def step(self, state, batch):
        return torch.tensor(self.losses.pop(0))

    def final(self, task, state, ctx):
        return Trained(ctx.tensors(state.model), metrics={"shift": lambda losses: losses.mean(each=lambda v: v + 1)})


def client_of(size):
    """A federation's runner and a round-1 task of a client holding `size` samples (batch 10, one epoch)."""
    fed = build_federation(load_config(None, ["model.name=mlp", "data.partition.kind=iid", "data.num_clients=54"]))
    assert (fed.clients.sizes() == size).any()
    client = int(np.flatnonzero(fed.clients.sizes() == size)[0])
    state = fed.policy.init_state(fed.initial_weights())
    return fed, ClientRunner.of(fed), fed.policy.configure(state, 1, [client])[0]


def test_the_loss_is_the_sample_weighted_mean_of_the_steps_read_once():
    fed, runner, task = client_of(25)  # batches of 10, 10 and 5
    out = Scripted(fed.config, [1.0, 2.0, 4.0]).run(task, runner.data(task.client_id), runner.context)
    assert isinstance(out, ClientResult)
    assert out.num_samples == 25 and out.train_loss == pytest.approx((1 * 10 + 2 * 10 + 4 * 5) / 25)
    assert out.metrics["shift"] == pytest.approx((2 * 10 + 3 * 10 + 5 * 5) / 25)


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_a_non_finite_loss_fails_the_client_with_the_samples_drawn_up_to_its_step(bad):
    # as a loop that stopped at that step: its batch counted, the later ones not
    fed, runner, task = client_of(25)
    out = Scripted(fed.config, [1.0, bad, 4.0]).run(task, runner.data(task.client_id), runner.context)
    assert isinstance(out, ClientFailure) and out.reason == NON_FINITE and out.num_samples == 20


def test_bf16_steps_run_end_to_end_and_are_recorded(tmp_path):
    sets = ["model.name=mlp", "federation.rounds=3", "metrics.tensorboard=false"]
    full = run_local(load_config(None, sets), tmp_path / "fp32")
    summary = run_local(load_config(None, [*sets, "federation.precision=bf16"]), tmp_path / "bf16")
    assert yaml.safe_load((tmp_path / "bf16" / "config.yaml").read_text())["federation"]["precision"] == "bf16"
    assert yaml.safe_load((tmp_path / "fp32" / "config.yaml").read_text())["federation"]["precision"] == "fp32"
    assert summary["final_test_accuracy"] > 0.3  # it learns (chance: 0.1), as fp32 does
    assert abs(summary["final_test_accuracy"] - full["final_test_accuracy"]) < 0.1
    low, full = (pd.read_parquet(tmp_path / p / "clients.parquet")["train_loss"] for p in ("bf16", "fp32"))
    assert not np.array_equal(low, full)  # the steps ran in bfloat16
    np.testing.assert_allclose(low, full, rtol=0.1)

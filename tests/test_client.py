"""An algorithm owns its steps: one defined here, in the test file alone, trains in stages
through the one client loop.

`TwoStage` trains the first linear layer with its own optimizer, then the last linear layer
with another, over seeded batches from the shared context (its `schedule`); the middle layer
never trains. It reports per-stage figures through `Trained.metrics`, which become columns of
`clients.parquet`. Nothing in `rayfl/` knows it.
"""

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rayfl import api
from rayfl.algorithms import registry
from rayfl.algorithms.base import ClientProcedure
from rayfl.algorithms.fedavg import FedAvgConfig, FedAvgPolicy
from rayfl.algorithms.local import LocalState, Trained
from rayfl.load import load_config
from rayfl.runner import run_local


class TwoStageConfig(FedAvgConfig):
    name: str = "twostage"


class TwoStage(ClientProcedure):
    """Stage 0: the first linear layer only; stage 1: the last linear layer only; each stage its
    own optimizer over its own layer and its own seeded pass over the data (its `schedule`)."""

    def init(self, task, ctx):
        return LocalState(ctx.load(task.model, task.weights).train(), None, extras={})

    def schedule(self, task, state, data, ctx):
        model = state.model
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        for stage, layer in enumerate((linears[0], linears[-1])):
            own = {id(p) for p in layer.parameters()}
            for p in model.parameters():
                p.requires_grad_(id(p) in own)
            state.optimizer = ctx.optimizer(task.optimizer, layer.parameters(), slot=f"stage-{stage}")
            before = {k: v.clone() for k, v in ctx.tensors(model).items()}
            yield from ctx.batches(task, data, purpose=f"stage-{stage}")
            inside = {k for k, p in model.named_parameters() if id(p) in own}
            moved = {k for k, v in ctx.tensors(model).items() if not torch.equal(before[k], v)}
            state.extras[f"moved_inside_{stage}"] = len(moved & inside)
            state.extras[f"moved_outside_{stage}"] = len(moved - inside)
        for p in model.parameters():  # the cached module serves the next task whole
            p.requires_grad_(True)

    def step(self, state, batch):
        x, y = batch
        state.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(state.model(x), y)
        loss.backward()
        state.optimizer.step()
        return loss.detach()

    def final(self, task, state, ctx):
        return Trained(ctx.tensors(state.model), metrics=dict(state.extras))


# Registered as any algorithm is, when its module is imported (here, by pytest; on a Ray actor, by
# unpickling the config, whose class lives here).
registry.register(registry.Algorithm("twostage", "a test's two-stage client", TwoStageConfig, FedAvgPolicy, TwoStage))


@pytest.fixture
def two_stage():
    return load_config(
        None,
        [
            "algorithm.name=twostage",
            "model.name=mlp",
            "model.hidden=[16, 16]",
            "federation.rounds=2",
            "federation.clients_per_round=3",
            "federation.momentum=0.9",
        ],
    )


def test_a_two_stage_run_moves_only_its_stage(two_stage, tmp_path):
    run_local(two_stage, tmp_path)
    clients = pd.read_parquet(tmp_path / "clients.parquet")
    assert len(clients) == 6 and (clients["status"] == "ok").all()
    # Each stage moved both tensors of its layer (weight, bias) and nothing else, bit for bit.
    assert (clients[["moved_inside_0", "moved_inside_1"]] == 2).all().all()
    assert (clients[["moved_outside_0", "moved_outside_1"]] == 0).all().all()
    # Two passes over each client's data (two stages x one epoch of batches of 10, a last
    # batch of a single sample dropped).
    n = clients["num_examples"]
    assert (clients["num_samples"] == 2 * (n - (n % 10 == 1))).all()
    # The middle layer never trained: the global model keeps its initial values exactly.
    from rayfl.checkpoint import latest
    from rayfl.engine import build_federation

    init = build_federation(two_stage).initial_weights()
    final = latest(tmp_path).state.weights
    middle = [k for k in init if k.startswith("5.")]  # Flatten, [Linear, Scaler, norm, ReLU] x 2, Linear
    assert middle and all(np.array_equal(init[k], final[k]) for k in middle)
    assert not np.array_equal(init["1.weight"], final["1.weight"]) and not np.array_equal(
        init["9.weight"], final["9.weight"]
    )


@pytest.mark.ray
def test_a_two_stage_run_on_ray_equals_in_process(ray_cluster, two_stage, tmp_path):
    cfg = two_stage.model_copy(update={"ray": two_stage.ray.model_copy(update={"num_actors": 2})})
    run_local(cfg, tmp_path / "local")
    api.run(cfg, tmp_path / "ray")
    for name in ("metrics.parquet", "clients.parquet"):
        a, b = (pd.read_parquet(tmp_path / d / name) for d in ("local", "ray"))
        cols = [c for c in a.columns if c != "wall_time_s"]
        pd.testing.assert_frame_equal(a[cols], b[cols])

"""PyramidFL-style selection: oversample by reward (with exploration), keep the fastest."""

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.algorithms.local import LocalState, finish
from rayfl.engine import ClientRunner, build_federation
from rayfl.engine.host import on_host
from rayfl.load import load_config
from rayfl.runner import run_local
from tests.algorithms.tiny import aggregated


@pytest.fixture
def fed(tmp_path):
    # Clients alternate between a slow and a fast device class on fixed links.
    profile = tmp_path / "two.yaml"
    profile.write_text(
        "name: two\nclasses:\n"
        "  - {name: slow, proportion: 1, flops: [1.0e+8], memory_mb: 64, bandwidth_mbps: [10, 10]}\n"
        "  - {name: fast, proportion: 1, flops: [1.0e+10], memory_mb: 64, bandwidth_mbps: [10, 10]}\n"
    )
    sets = [
        "algorithm.name=pyramidfl",
        "algorithm.oversample=2",
        "algorithm.explore=0",
        "model.name=mlp",
        "data.partition.kind=iid",
        "federation.clients_per_round=3",
        f"devices.profile={profile}",
    ]
    return build_federation(load_config(None, sets))


def test_keeps_the_fastest_of_the_highest_reward_candidates(fed):
    policy = fed.policy
    state = policy.init_state(fed.initial_weights())
    rewards = np.arange(20, 0, -1.0)  # client 0 has the largest reward
    state = state.replace(clients={c: {"reward": np.array(rewards[c])} for c in range(20)})
    chosen = policy.select(state, 1, list(range(20)), 3)
    candidates = list(range(6))  # ceil(2 * 3) = 6 best rewards: clients 0..5
    fast = [c for c in candidates if fed.population.device_class(c).name == "fast"]
    slow = [c for c in candidates if fed.population.device_class(c).name == "slow"]
    expected = sorted((fast + slow)[:3]) if len(fast) < 3 else sorted(fast[:3])
    assert chosen == expected and set(chosen) <= set(candidates)


def test_rewards_are_update_norms_and_unseen_clients_are_explored_first(fed):
    policy = fed.policy
    state = policy.init_state(fed.initial_weights())
    first = policy.select(state, 1, list(range(20)), 3)
    assert len(first) == 3  # nobody has a reward yet: candidates are drawn uniformly
    # The client reports ||x_k - x_t|| over its parameters: +1 everywhere gives sqrt(#parameters).
    task = policy.configure(state, 1, [first[0]])[0]
    runner = ClientRunner.of(fed)
    model = runner.context.load(task.model, task.weights)
    with torch.no_grad():
        for p in model.parameters():
            p += 1.0
    trained = fed.procedure.final(task, LocalState(model, None), runner.context)
    result = on_host(finish(task, runner.data(task.client_id), trained, [], 10))
    size = sum(np.asarray(task.weights[k]).size for k in policy.context.param_names)
    assert result.metrics["update_norm"] == pytest.approx(np.sqrt(size))
    new = aggregated(policy, state, 1, [result])
    assert float(new.clients[first[0]]["reward"]) == result.metrics["update_norm"]
    assert np.isnan(float(new.clients[first[1]]["reward"]))


def test_pyramidfl_trains_end_to_end(tmp_path):
    summary = run_local(
        load_config(None, ["algorithm.name=pyramidfl", "model.name=mlp", "federation.rounds=4"]), tmp_path
    )
    assert summary["final_test_accuracy"] > 0.5
    assert pd.read_parquet(tmp_path / "clients.parquet").groupby("round").size().tolist() == [10] * 4

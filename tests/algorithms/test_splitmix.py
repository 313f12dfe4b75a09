"""SplitMix (Hong et al. 2022): the shuffle-cycle sampler, each client's bases by width, the
per-base sample-weighted mean, the mix of the first n bases' logits, and a short digits run under
FeDepth's Fair budgets.

The unit tests build the policy on a hand-made context whose training memory is linear in the
width (600 bytes at width 1), so budgets of 100, 200, 300 and 600 bytes are widths 1/6, 1/3,
1/2 and 1: the atom is 1/6 (K = 6 bases) and the clients train 1, 2, 3 and 6 bases.
"""

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.algorithms import aggregate
from rayfl.algorithms.messages import ClientResult, FederationContext
from rayfl.algorithms.splitmix import SplitMixPolicy, client_bases, first_bases
from rayfl.config import ConfigError
from rayfl.devices import configured_profile
from rayfl.devices.cost import nbytes
from rayfl.load import load_config
from rayfl.runner import run_local
from tests.algorithms.tiny import aggregated

BUDGETS = np.array([100.0, 200.0, 300.0, 600.0] * 2)
BASES = [1, 2, 3, 6] * 2
"""What each budget buys: floor(width / (1/6)) bases."""


def stub_policy(*extra: str) -> SplitMixPolicy:
    # FeDepth's Fair budgets r = 1/6, 1/3, 1/2, 1 (memory_width), one class per client in turn.
    config = load_config(
        None,
        [
            "algorithm.name=splitmix",
            "devices.profile=fedepth_fair",
            "data.num_clients=8",
            "federation.clients_per_round=4",
            *extra,
        ],
    )
    cost = lambda variant: SimpleNamespace(
        training_memory=lambda batch, slots: 600.0 * variant.rate, train_flops=6.0 * variant.rate, num_params=1
    )
    context = FederationContext(
        seed=7,
        num_clients=8,
        num_classes=10,
        input_shape=(1, 8, 8),
        num_examples=np.full(8, 20),
        label_histogram=lambda: None,
        param_names=frozenset(),
        memory_bytes=BUDGETS,
        test_split=None,
        cost_of=cost,
        device_classes=np.arange(8) % 4,
        profile=configured_profile(config.devices),
        training_memory=lambda variant: cost(variant).training_memory(20, 0),
    )
    return SplitMixPolicy(config, context)


def marked_state(policy: SplitMixPolicy):
    """Every tensor of base k filled with k (float32)."""
    state = policy.init_state({})
    return state.replace(
        weights={k: np.full(v.shape, float(k.split(".")[0][4:]), np.float32) for k, v in state.weights.items()}
    )


def test_shuffle_cycle_balances_first_bases_and_is_pure():
    for m, expect in ((8, [1, 1, 1, 1, 2, 2]), (12, [2] * 6), (4, [0, 0, 1, 1, 1, 1])):
        firsts = first_bases(3, 5, list(range(m)), 6)
        counts = Counter(firsts)
        assert sorted(counts.get(k, 0) for k in range(6)) == expect  # floor(m / 6) or ceil(m / 6) each
        assert first_bases(3, 5, list(range(m)), 6) == firsts
    # A pure function of (seed, round): the clients' ids do not enter, rounds differ.
    assert first_bases(3, 5, [10, 20, 30], 6) == first_bases(3, 5, [0, 1, 2], 6)
    assert len({tuple(first_bases(3, r, range(6), 6)) for r in range(1, 6)}) > 1


def test_client_bases_are_distinct_and_start_with_the_sampler():
    for n in range(1, 7):
        bases = client_bases(3, 2, 4, first=5, n=n, num_bases=6)
        assert bases[0] == 5 and len(set(bases)) == n and set(bases) <= set(range(6))
        assert client_bases(3, 2, 4, first=5, n=n, num_bases=6) == bases


def test_each_width_trains_its_share_of_the_bases():
    policy = stub_policy()
    assert policy.num_bases == 6 and policy.atom == pytest.approx(1 / 6) and policy.base.rate == pytest.approx(1 / 6)
    assert policy.counts.tolist() == BASES
    state = marked_state(policy)
    tasks = policy.configure(state, 3, range(8))
    firsts = first_bases(7, 3, range(8), 6)
    for t, n, first in zip(tasks, BASES, firsts):
        assert len(t.bases) == n and len(set(t.bases)) == n and t.bases[0] == first
        # Only the task's bases travel, under their global names.
        assert {k.split(".")[0] for k in t.weights} == {f"base{b}" for b in t.bases}
        assert len(t.weights) == n * len(state.weights) // 6
        assert all(float(v.flat[0]) == float(k.split(".")[0][4:]) for k, v in t.weights.items())
        assert policy.client_cost(
            t,
            ClientResult(
                client_id=t.client_id, round=3, weights=t.weights, num_examples=20, num_samples=20, train_loss=0.0
            ),
        ) == (n * 6.0 / 6 * 20, nbytes(t.weights), nbytes(t.weights))
    # A configured atom of 1/8 makes 8 bases: floor(r * 8) = 1, 2, 4, 8.
    assert stub_policy("algorithm.atom=0.125").counts.tolist() == [1, 2, 4, 8] * 2


def test_each_base_is_averaged_over_its_trainers_by_samples():
    policy = stub_policy()
    state = marked_state(policy)
    state = state.replace(weights={k: np.full_like(v, -1.0) for k, v in state.weights.items()})

    def result(client, bases, n, value):
        heads = {f"base{b}" for b in bases}
        return ClientResult(
            client_id=client,
            round=1,
            weights={k: np.full_like(v, value) for k, v in state.weights.items() if k.split(".")[0] in heads},
            num_examples=n,
            num_samples=n,
            train_loss=0.0,
        )

    results = [result(1, (0, 2), 10, 1.0), result(2, (2, 3), 30, 5.0)]
    total = aggregate.add_up(policy.summand(r) for r in results)
    weightless = [
        ClientResult(
            client_id=r.client_id,
            round=1,
            weights={},
            num_examples=r.num_examples,
            num_samples=r.num_samples,
            train_loss=0.0,
        )
        for r in results
    ]  # as the engine passes them
    for new in (aggregated(policy, state, 1, results), policy.aggregate(state, 1, weightless, total)):
        values = {
            b: {float(x) for k, v in new.weights.items() if k.startswith(f"base{b}.") for x in np.ravel(v)}
            for b in range(6)
        }
        assert values[0] == {1.0}  # client 1 alone
        assert values[2] == {(10 * 1.0 + 30 * 5.0) / 40}  # 4.0, exact in float32
        assert values[3] == {5.0}  # client 2 alone
        assert values[1] == values[4] == values[5] == {-1.0}  # nobody trained them
        assert all(v.dtype == np.float32 for v in new.weights.values())
    assert aggregated(policy, state, 1, []).weights is state.weights


# Margins (class-1 logit minus class-0 logit) of bases 0..5 on four samples, all of class 0.
MARGINS = np.array([[-1, -1, -1, -1], [3, 3, 3, -3], [-5, -5, 0, 0], [10, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], float)


def test_width_r_mixes_the_first_r_over_atom_bases():
    policy = stub_policy()
    calls = []

    def logits(weights, variant):
        assert variant == policy.base
        k = int(next(iter(weights.values())).flat[0])  # the marked base
        assert all(not name.startswith("base") for name in weights)  # one base's own state
        calls.append(k)
        return torch.tensor(np.stack([np.zeros(4), MARGINS[k]], 1))

    out = policy.evaluate(marked_state(policy), 1, SimpleNamespace(logits=logits, y=torch.zeros(4, dtype=torch.long)))
    assert calls == list(range(6))
    # Mean margins of the first n bases: n=1 [-1,-1,-1,-1]; n=2 [1,1,1,-2]; n=3 [-1,-1,2/3,-4/3];
    # n=6 [8,-2,3,-3]/6. Class 0 wins where the mean margin is negative.
    assert out["test_accuracy@0.1667"] == 1.0
    assert out["test_accuracy@0.3333"] == 0.25
    assert out["test_accuracy@0.5"] == 0.75
    assert out["test_accuracy@1"] == out["test_accuracy"] == 0.5
    # Cross-entropy of class 0 with logits [0, m]: log(1 + e^m), at the full mix's mean margin.
    assert out["test_loss"] == pytest.approx(np.mean(np.log1p(np.exp(np.array([8, -2, 3, -3]) / 6))))


def test_config_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="model.name: splitmix needs a width-scalable model"):
        load_config(None, ["algorithm.name=splitmix", "model.name=alexnet"])
    with pytest.raises(ConfigError, match="atom"):
        load_config(None, ["algorithm.name=splitmix", "algorithm.atom=0.3"])
    torch.save(
        {}, tmp_path / "pretrained.pt"
    )  # the bases are drawn by init_state: a pretrained state is refused, not dropped
    with pytest.raises(ConfigError, match="model.init_weights: splitmix draws its K base networks itself"):
        load_config(None, ["algorithm.name=splitmix", f"model.init_weights={tmp_path / 'pretrained.pt'}"])


def test_two_rounds_on_digits_under_fedepth_fair(tmp_path):
    config = load_config(
        None,
        [
            "algorithm.name=splitmix",
            "devices.profile=fedepth_fair",
            "data.num_clients=8",
            "federation.clients_per_round=4",
            "federation.rounds=2",
            "federation.local_epochs=1",
        ],
    )
    assert config.model.name == "preresnet20"
    summary = run_local(config, tmp_path)
    assert summary["bases"] == 6 and summary["atom"] == pytest.approx(1 / 6)
    metrics = pd.read_parquet(tmp_path / "metrics.parquet")
    clients = pd.read_parquet(tmp_path / "clients.parquet")
    assert len(metrics) == 2 and np.isfinite(metrics["test_accuracy"]).all()
    assert {"test_accuracy@0.1667", "test_accuracy@0.3333", "test_accuracy@0.5", "test_accuracy@1"} <= set(
        metrics.columns
    )
    assert (clients["status"] == "ok").sum() > 0
    # Fair's widths 1/6, 1/3, 1/2 and 1 train 1, 2, 3 and 6 bases.
    assert set(clients["bases"]) <= {1.0, 2.0, 3.0, 6.0}
    assert (clients["width"] == clients["bases"] / 6).all()

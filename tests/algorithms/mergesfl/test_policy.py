"""MergeSFL's policy: control decisions inside the budget, state updates, an end-to-end run."""

import numpy as np
import pandas as pd
import pytest

from rayfl.algorithms.mergesfl import control
from rayfl.engine import build_federation
from rayfl.load import load_config
from rayfl.runner import run_local
from tests.algorithms.tiny import aggregated

BASE = [
    "algorithm.name=mergesfl",
    "model.name=cnn2",
    "data.partition={kind: noniid_level, p: 10}",
    "federation.lr=0.05",
]
PLAN = [
    *BASE,
    "algorithm.max_merged=120",
    "algorithm.max_batch=16",
    "federation.batch_size=8",
]  # lr is the rate at batch 8


@pytest.fixture(scope="module")
def fed():
    return build_federation(load_config(None, PLAN))


def test_round_plan_respects_the_budget_and_scales_lr_with_batch(fed):
    policy = fed.policy
    state = policy.init_state(fed.initial_weights())
    chosen = policy.select(state, 1, list(range(20)), policy.config.federation.clients_per_round)
    d_regulated = policy.batch_sizes(state)
    assert control.within_bandwidth(d_regulated[chosen], np.ones(len(chosen), bool), 1.0, 120)
    tasks = policy.configure(state, 1, chosen)
    d = np.array([t.batch_size for t in tasks])
    assert d.sum() <= 120 and d.min() >= 1 and d.max() <= 16
    assert all(t.optimizer.lr == pytest.approx(0.05 * t.batch_size / 8) for t in tasks)
    # Eq. 9: the fastest worker (smallest mu + beta) is dealt D.
    mu, beta, _ = policy.estimates(state)
    assert d_regulated[np.argmin(mu + beta)] == 16


def test_aggregate_counts_participation_and_smooths_estimates(fed):
    policy = fed.policy
    state = policy.init_state(fed.initial_weights())
    mu0, beta0, _ = policy.estimates(state)
    tasks = policy.configure(state, 1, [2, 5])
    from rayfl.runner import InProcessExecutor

    results = InProcessExecutor(fed).exchange(tasks, policy.open_driver(state, 1, tasks))
    new = aggregated(policy, state, 1, results)
    mu1, beta1, K = policy.estimates(new)
    mu_hat, beta_hat = policy.measure(1)
    np.testing.assert_allclose(mu1, 0.8 * mu0 + 0.2 * mu_hat)  # Eq. 5
    np.testing.assert_allclose(beta1, 0.8 * beta0 + 0.2 * beta_hat)  # Eq. 6
    assert K[[2, 5]].tolist() == [1, 1] and K.sum() == 2


def test_without_regulation_every_worker_gets_the_mean_eq9_size(fed):
    # Fig. 11's "MergeSFL w/o BR": one identical batch size, the average of MergeSFL's.
    state = fed.policy.init_state(fed.initial_weights())
    regulated = fed.policy.batch_sizes(state)
    ablation = build_federation(load_config(None, [*PLAN, "algorithm.regulate_batch=false"])).policy
    d = ablation.batch_sizes(state)
    assert len(d) == len(regulated) and set(d.tolist()) == {round(regulated.mean())}
    assert regulated.min() < d[0] < regulated.max()


def test_regulation_aligns_durations_against_the_ablation(tmp_path):
    # Fixed links and three fixed speeds, no measurement noise: Eq. 9 can align durations exactly.
    profile = tmp_path / "speeds.yaml"
    profile.write_text(
        "name: speeds\nclasses:\n"
        "  - {name: slow, proportion: 1, flops: [1.0e+9], memory_mb: 64, bandwidth_mbps: [20, 20]}\n"
        "  - {name: mid, proportion: 1, flops: [4.0e+9], memory_mb: 64, bandwidth_mbps: [20, 20]}\n"
        "  - {name: fast, proportion: 1, flops: [1.6e+10], memory_mb: 64, bandwidth_mbps: [20, 20]}\n"
    )
    out = {}
    for name, extra in (("mergesfl", []), ("no-regulation", ["algorithm.regulate_batch=false"])):
        sets = [*BASE, "federation.rounds=3", "algorithm.noise=0", f"devices.profile={profile}", *extra]
        run_local(load_config(None, sets), tmp_path / name)
        out[name] = pd.read_parquet(tmp_path / name / "metrics.parquet")
    same = pd.read_parquet(tmp_path / "no-regulation" / "clients.parquet").groupby("round")["batch_size"].nunique()
    assert (same == 1).all() and len(same) == 3
    assert (out["mergesfl"]["merged_batch"] <= 160).all() and (out["no-regulation"]["merged_batch"] <= 160).all()
    assert out["mergesfl"]["mean_wait_s"].mean() < 0.75 * out["no-regulation"]["mean_wait_s"].mean()


def test_top_lr_scales_with_the_batch_it_steps_on(fed):
    state = fed.policy.init_state(fed.initial_weights())
    tasks = fed.policy.configure(state, 1, [2, 5, 7])
    plain = build_federation(load_config(None, [*PLAN, "algorithm.scale_top_lr=false"]))
    assert plain.policy.top_lrs(1, tasks) == [0.05]  # federation.lr for every top step
    merged = sum(t.batch_size for t in tasks)
    assert fed.policy.top_lrs(1, tasks) == pytest.approx([0.05 * merged / 8])
    unmerged = build_federation(load_config(None, [*PLAN, "algorithm.merge_features=false"])).policy
    assert unmerged.top_lrs(1, tasks) == pytest.approx([0.05 * t.batch_size / 8 for t in tasks])


def test_the_budget_can_be_estimated_from_the_ingress_of_earlier_rounds(fed):
    # Sec. IV-B: B^h from the statistics of the PS's ingress in previous rounds. With jitter the
    # available ingress varies per round; the estimate is the configured quantile of what was seen.
    sets = [
        *PLAN,
        "algorithm.budget=estimated",
        "algorithm.budget_quantile=0.25",
        "algorithm.ingress_jitter=0.3",
        "algorithm.ga_generations=10",
    ]
    est = build_federation(load_config(None, sets))
    policy = est.policy
    state = policy.init_state(est.initial_weights())
    assert policy.budget(state) == 120  # nothing observed yet: max_merged
    from rayfl.runner import InProcessExecutor

    seen = []
    for rnd in (1, 2, 3):
        tasks = policy.configure(
            state, rnd, policy.select(state, rnd, list(range(20)), policy.config.federation.clients_per_round)
        )
        assert sum(t.batch_size for t in tasks) <= policy.budget(state) + 1e-9  # Eq. 10 under the round's B^h
        results = InProcessExecutor(est).exchange(tasks, policy.open_driver(state, rnd, tasks))
        state = aggregated(policy, state, rnd, results)
        seen.append(policy.ingress(rnd))
        assert state.opt_state.observed == tuple(seen)
        assert policy.budget(state) == pytest.approx(np.quantile(seen, 0.25))
    assert len(set(seen)) == 3  # the ingress varied round to round
    # The fixed budget ignores what was observed.
    assert fed.policy.budget(state) == 120

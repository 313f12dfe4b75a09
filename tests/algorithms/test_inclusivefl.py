"""InclusiveFL (Liu et al. 2022, Algorithm 1): which layers each group shares, the layer-wise
aggregation weights, momentum distillation against a hand-computed two-round example, the depth
baselines, and HeteroFL at equal parameter counts.

The public code's momentum distillation is a no-op through three bugs (docs/papers.md,
InclusiveFL: public code, momentum distillation);
each one fails an assertion here:
- it assigns instead of accumulating over the layers: `test_momentum_is_the_mean_over_layers`
  (m = 3; keeping the last layer gives 6 / 3 = 2) and, through the policy, the round-1 momentum
  assertion of `test_two_rounds_through_the_policy` (1.5; the last layer alone gives 1 / 2);
- it caches a reference to gradients that are zeroed in place: `test_momentum_is_a_copy`, and the
  round-2 top-layer assertion of `test_two_rounds_through_the_policy` (1.75; zero momentum gives 1.0);
- it blends only while the momentum is still the integer 0: the same round-2 top-layer assertion
  (1.75; no blend gives 1.5).
"""

import numpy as np
import pandas as pd
import pytest

from rayfl.algorithms.inclusivefl import policy as inclusivefl_policy
from rayfl.algorithms.inclusivefl.policy import distill, heterogeneous, momentum_of, sharers
from rayfl.algorithms.messages import ClientResult
from rayfl.config import ConfigError
from rayfl.engine import build_federation
from rayfl.load import load_config
from rayfl.models import build_model
from rayfl.runner import run_local
from tests.algorithms.tiny import aggregated

P = "layers."


def test_sharers_at_4_8_12():
    # Alg. 1 l. 26-27 with L = 4, 8, 12 (1-based): layers 1..3 shared by all, 4..7 by the medium and
    # large models, 8..11 by the large one alone; each model's top layer (4, 8, 12) is its own.
    depths = [4, 8, 12]
    expect = {
        0: [0, 1, 2],
        1: [0, 1, 2],
        2: [0, 1, 2],
        3: [1, 2],
        4: [1, 2],
        5: [1, 2],
        6: [1, 2],
        7: [2],
        8: [2],
        9: [2],
        10: [2],
        11: [],
    }
    assert {i: sharers(f"layers.{i}.attn.q", depths, P) for i in range(12)} == expect
    assert sharers("embed.weight", depths, P) == [0, 1, 2]  # the stem: everyone's bottom
    assert sharers("head.fc.weight", depths, P) == []  # every head is isolated


def test_sharers_at_2_4_6():
    depths = [2, 4, 6]
    assert [sharers(f"layers.{i}.w", depths, P) for i in range(6)] == [[0, 1, 2], [1, 2], [1, 2], [2], [2], []]


def test_heterogeneous_weights_are_the_groups_sample_shares():
    depths = [1, 2, 3]
    keys = ["stem.w", "layers.0.w", "layers.1.w", "layers.2.w", "head.w"]
    held = {0: keys[:2] + ["head.w"], 1: keys[:3] + ["head.w"], 2: keys}
    new = {j: {k: np.full(2, j + 1.0) for k in held[j]} for j in held}  # group j's values: j + 1
    old = {k: np.full(2, -9.0, np.float32) for k in keys}
    shares = {0: 10.0, 1: 30.0, 2: 60.0}
    out = heterogeneous(old, new, shares, depths, P)
    assert out["stem.w"][0] == pytest.approx((10 * 1 + 30 * 2 + 60 * 3) / 100)  # all three: 2.5
    assert out["layers.0.w"][0] == pytest.approx((30 * 2 + 60 * 3) / 90)  # group 0's top layer is its own
    assert out["layers.1.w"][0] == 3.0 and out["layers.2.w"][0] == 3.0 and out["head.w"][0] == 3.0
    assert out["stem.w"].dtype == np.float32
    # The large group sat the round out: shares renormalise over who came; its own layers keep their values.
    out = heterogeneous(old, {0: new[0], 1: new[1]}, shares, depths, P)
    assert out["stem.w"][0] == pytest.approx((10 * 1 + 30 * 2) / 40) and out["layers.0.w"][0] == 2.0
    assert out["layers.1.w"][0] == -9.0 and out["layers.2.w"][0] == -9.0 and out["head.w"][0] == -9.0


def test_momentum_is_the_mean_over_layers():
    # Alg. 1 l. 22 for the medium group (L^- = 2, L_j = 4): layers 2..4, 0-based 1..3.
    update = {
        "stem.w": np.array([100.0]),
        "layers.0.w": np.array([50.0]),
        "layers.1.w": np.array([1.0]),
        "layers.2.w": np.array([2.0]),
        "layers.3.w": np.array([6.0]),
        "head.w": np.array([7.0]),
    }
    assert momentum_of(update, 1, 3, P) == {"w": pytest.approx([3.0])}  # (1 + 2 + 6) / 3


def test_momentum_is_a_copy():
    update = {"layers.0.w": np.array([4.0]), "layers.1.w": np.array([2.0])}
    m = momentum_of(update, 1, 1, P)
    for v in update.values():
        v[:] = 0.0  # what zero_grad() does to the public code's cached gradients
    assert m["w"].tolist() == [2.0]


def test_distill_blends_the_top_layer_only():
    update = {
        "stem.w": np.array([1.0]),
        "layers.0.w": np.array([1.0]),
        "layers.1.w": np.array([1.0]),
        "layers.1.b": np.array([2.0]),
        "head.w": np.array([1.0]),
    }
    out = distill(update, {"w": np.array([3.0]), "b": np.array([-2.0])}, 1, 0.2, P)
    assert out["layers.1.w"].tolist() == pytest.approx([0.2 * 3 + 0.8 * 1]) and out[
        "layers.1.b"
    ].tolist() == pytest.approx([0.2 * -2 + 0.8 * 2])
    assert out["stem.w"].tolist() == [1.0] and out["layers.0.w"].tolist() == [1.0] and out["head.w"].tolist() == [1.0]


TINY = [
    "model.name=transformer",
    "model.width=4",
    "model.heads=1",
    "model.ffn=4",
    "model.depth=3",
    "devices.profile=mobile",
    "data.num_clients=12",
]


def tiny_policy(*extra):
    fed = build_federation(load_config(None, ["algorithm.name=inclusivefl", "algorithm.depths=1-2-3", *TINY, *extra]))
    return fed.policy, fed.context


def test_two_rounds_through_the_policy():
    """FedAvg server step (x + Delta), beta 0.5, one client per group with 10, 30, 60 samples;
    every weight starts at 0. Round 1: group j's client returns j + 1 everywhere; round 2: its
    sub-global model + 1. The expected values are worked out in the comments."""
    policy, ctx = tiny_policy("algorithm.server_opt=avg", "algorithm.beta=0.5")
    client = [int(np.flatnonzero(ctx.device_classes == j)[0]) for j in range(3)]  # weak, medium, strong
    state = policy.init_state(
        {
            k: np.zeros(v.shape, np.float32)
            for k, v in build_model(policy.global_model(), ctx.input_shape, ctx.num_classes).state_dict().items()
        }
    )

    def result(j, rnd, value):
        sub = policy.submodel(state, j)
        return ClientResult(
            client_id=client[j],
            round=rnd,
            weights={k: value(v) for k, v in sub.items()},
            num_examples=[10, 30, 60][j],
            num_samples=1,
            train_loss=0.0,
        )

    def group(state, j, prefix):
        return sorted(
            {float(v) for k, arr in policy.submodel(state, j).items() if k.startswith(prefix) for v in np.ravel(arr)}
        )

    def momenta(state, j):
        return sorted({float(v) for m in state.opt_state[j].momentum.values() for v in np.ravel(m)})

    state = aggregated(policy, state, 1, [result(j, 1, lambda v, j=j: np.full_like(v, j + 1.0)) for j in range(3)])
    # Weak (depth 1): top layer 0 takes (1 - b) g + b m = 0.5 (m still 0); stem and head 1.
    assert group(state, 0, "layers.0.") == [0.5] and group(state, 0, "head.") == [1.0]
    # Medium (depth 2): top layer 1 takes 0.5 * 2 = 1; its momentum over layers 1..2 is (2 + 1) / 2.
    assert group(state, 1, "layers.1.") == [1.0] and group(state, 1, "head.") == [2.0]
    assert momenta(state, 1) == [1.5]
    assert momenta(state, 2) == [3.0]
    # Shared: the stem over all three by samples, layer 0 over medium and large (the weak one's top).
    assert group(state, 2, "embed.") == pytest.approx([2.5]) and group(state, 2, "layers.0.") == pytest.approx([8 / 3])
    assert (
        group(state, 2, "layers.1.") == [3.0]
        and group(state, 2, "layers.2.") == [3.0]
        and group(state, 2, "head.") == [3.0]
    )

    state = aggregated(policy, state, 2, [result(j, 2, lambda v: v + 1.0) for j in range(3)])
    # Weak: top layer 0.5 + (0.5 * 1.5 + 0.5 * 1) = 1.75, the medium group's round-1 momentum blended in.
    assert group(state, 0, "layers.0.") == [1.75] and group(state, 0, "head.") == [2.0]
    # Medium: top layer 1 + (0.5 * 3 + 0.5 * 1) = 3, the large group's round-1 momentum; new momentum (1 + 2) / 2.
    assert group(state, 1, "layers.1.") == [3.0] and group(state, 1, "head.") == [3.0]
    assert momenta(state, 1) == [1.5]
    assert momenta(state, 2) == [1.0]
    assert group(state, 2, "embed.") == pytest.approx([3.5]) and group(state, 2, "layers.0.") == pytest.approx([11 / 3])
    assert group(state, 2, "layers.1.") == [4.0] and group(state, 2, "head.") == [4.0]


def test_each_group_takes_its_own_fedadam_step():
    # Reddi et al. Alg. 2, first step from m = 0, v = tau^2, with Delta = 1 everywhere:
    # m = (1 - b1), v = b2 tau^2 + (1 - b2), x += eta m / (sqrt(v) + tau); eta per group (server_lrs).
    policy, ctx = tiny_policy("algorithm.server_lrs=[0.1, 0.2, 0.4]", "algorithm.beta=0")
    client = [int(np.flatnonzero(ctx.device_classes == j)[0]) for j in range(3)]
    state = policy.init_state(
        {
            k: np.zeros(v.shape, np.float32)
            for k, v in build_model(policy.global_model(), ctx.input_shape, ctx.num_classes).state_dict().items()
        }
    )
    results = [
        ClientResult(
            client_id=client[j],
            round=1,
            weights={k: np.ones_like(v) for k, v in policy.submodel(state, j).items()},
            num_examples=5,
            num_samples=5,
            train_loss=0.0,
        )
        for j in range(3)
    ]
    state = aggregated(policy, state, 1, results)
    b1, b2, tau = 0.9, 0.99, 1e-3
    step = (1 - b1) / (np.sqrt(b2 * tau**2 + (1 - b2)) + tau)
    for j, eta in enumerate([0.1, 0.2, 0.4]):
        head = np.concatenate([np.ravel(v) for k, v in policy.submodel(state, j).items() if k.startswith("head.")])
        np.testing.assert_allclose(head, eta * step, rtol=1e-6)
        assert state.opt_state[j].opt.t == 1 and state.opt_state[j].opt.eta == eta


def test_groups_follow_device_classes_and_baselines_take_one_group():
    policy, ctx = tiny_policy("devices.mix=1:2:3")
    state = policy.init_state(
        {
            k: v.numpy()
            for k, v in build_model(policy.global_model(), ctx.input_shape, ctx.num_classes).state_dict().items()
        }
    )
    tasks = policy.configure(state, 1, range(12))
    assert [t.model.depth for t in tasks] == [[1, 2, 3][c] for c in ctx.device_classes]
    assert sorted(np.bincount(ctx.device_classes)) == [2, 4, 6]
    for name, depth, clients in (("alllarge_depth", 3, 12), ("allsmall_depth", 1, 12), ("exclusivefl_depth", 3, 6)):
        fed = build_federation(
            load_config(
                None,
                [
                    f"algorithm.name={name}",
                    "algorithm.depths=1-2-3",
                    *TINY,
                    "devices.mix=1:2:3",
                    "federation.clients_per_round=12",
                ],
            )
        )
        chosen = fed.policy.select(None, 1, range(12), 12)
        assert len(chosen) == clients and fed.policy.global_model().depth == depth
        if name == "exclusivefl_depth":
            assert (fed.context.device_classes[chosen] == 2).all()  # the strongest class only


def test_depths_must_fit_the_profile_and_the_model():
    with pytest.raises(ConfigError, match="algorithm.depths: 2 depths for the 3 device classes"):
        load_config(
            None,
            [
                "algorithm.name=inclusivefl",
                "algorithm.depths=3-6",
                *TINY[:-2],
                "model.depth=6",
                "devices.profile=mobile",
            ],
        )
    with pytest.raises(ConfigError, match=r"algorithm.depths: the largest depth \(4\) must be model.depth \(3\)"):
        load_config(None, ["algorithm.name=inclusivefl", "algorithm.depths=1-2-4", *TINY])
    with pytest.raises(ConfigError, match="model.name: inclusivefl needs a depth-sliceable model"):
        load_config(None, ["algorithm.name=inclusivefl", "model.name=cnn"])


def metrics(run_dir):
    return pd.read_parquet(run_dir / "metrics.parquet").drop(columns="wall_time_s")


def test_beta_zero_is_inclusivefl_without_momentum_distillation(tmp_path, monkeypatch):
    base = [
        "algorithm.name=inclusivefl",
        "federation.rounds=3",
        "devices.profile=mobile",
        "data.num_clients=12",
        "federation.clients_per_round=6",
    ]
    run_local(load_config(None, [*base, "algorithm.beta=0"]), tmp_path / "beta0")
    run_local(load_config(None, [*base, "algorithm.beta=0.5"]), tmp_path / "beta05")
    with monkeypatch.context() as m:  # w/o MD by construction: the top-layer update is never touched
        m.setattr(inclusivefl_policy, "distill", lambda update, *args: update)
        run_local(load_config(None, [*base, "algorithm.beta=0.5"]), tmp_path / "without")
    pd.testing.assert_frame_equal(metrics(tmp_path / "beta0"), metrics(tmp_path / "without"))
    m = metrics(tmp_path / "beta05")
    assert (m["test_accuracy@strong"] == m["test_accuracy"]).all() and (
        m["test_accuracy@weak"] != m["test_accuracy"]
    ).any()
    assert (
        metrics(tmp_path / "beta0")["test_accuracy@weak"].tolist()
        != metrics(tmp_path / "beta05")["test_accuracy@weak"].tolist()
    )


def test_heterofl_at_the_depth_models_parameter_counts():
    # InclusiveFL Sec. 4.1: HeteroFL's widths reduced so each level has the parameters of a depth
    # model (2, 4 and 6 layers); levels dealt by device class, the strongest the global model.
    cfg = load_config(
        None,
        [
            "algorithm.name=heterofl",
            "algorithm.levels=a1-b1-c1",
            "algorithm.match_depths=2-4-6",
            "algorithm.mode=class",
            "model.name=transformer",
            "devices.profile=mobile",
        ],
    )
    fed = build_federation(cfg)
    levels = fed.policy.summary()["levels"]
    count = lambda **change: sum(
        p.numel() for p in build_model(cfg.model.model_copy(update=change), fed.context.input_shape, 10).parameters()
    )
    assert levels["a"]["params"] == count(depth=6) and levels["a"]["rate"] == 1.0
    for name, depth in (("b", 4), ("c", 2)):
        target = count(depth=depth)
        # The nearer side of the width step where the count passes the depth model's.
        below, above = count(rate=levels[name]["rate"] - 1e-3), count(rate=levels[name]["rate"] + 1e-3)
        assert min(below, above) <= target <= max(below, above) or levels[name]["params"] == target
        assert abs(levels[name]["params"] - target) == min(abs(below - target), abs(above - target))
    assert all(fed.policy.level_of(1, c) == 2 - fed.context.device_classes[c] for c in range(fed.context.num_clients))

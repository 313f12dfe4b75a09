"""HeteroFL: slicing, per-entry aggregation, PreResNet alignment, Table 1 counts, levels, masking."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from rayfl.algorithms.aggregate import AggregationError, add_up, count_finish, count_sum, extract
from rayfl.algorithms.heterofl import (
    HeteroFLPolicy,
    assign_capability,
    assign_fix,
    masked_logits,
    parse_levels,
)
from rayfl.algorithms.messages import ClientResult, FederationContext
from rayfl.config import ConfigError
from rayfl.data import Dataset, Partitioned
from rayfl.devices import CostCache
from rayfl.load import parse_config
from rayfl.models import build_model
from rayfl.models.preresnet import PreResNetConfig
from rayfl.runner import run_local
from tests.algorithms.tiny import aggregated


def count_mean(global_weights, updates, row_masks=None, client_weights=None):
    """HeteroFL's aggregation as the engine composes it: the sum of the clients' `count_sum`s, then `count_finish`."""
    masks = row_masks or [None] * len(updates)
    scale = client_weights or [1.0] * len(updates)
    shapes = {k: np.shape(v) for k, v in global_weights.items()}
    return count_finish(global_weights, add_up(count_sum(shapes, u, m, w) for u, m, w in zip(updates, masks, scale)))


def test_count_mean_overlaps_and_untouched_entries():
    glob = {"w": np.full((3, 3), 9.0, np.float32)}
    a = {"w": np.ones((2, 2), np.float32)}  # a narrow client: the top-left 2x2 block
    b = {"w": np.full((2, 3), 3.0, np.float32)}  # a wider one: two full rows
    out = count_mean(glob, [a, b])["w"]
    # overlap (both hold it): (1 + 3) / 2 = 2; only b: 3; nobody: keeps 9
    assert out.tolist() == [[2, 2, 3], [2, 2, 3], [9, 9, 9]]
    weighted = count_mean(glob, [a, b], client_weights=[1, 3])["w"]
    assert weighted[0, 0] == pytest.approx((1 * 1 + 3 * 3) / 4) and weighted[0, 2] == 3 and weighted[2, 0] == 9


def test_count_mean_counts_classifier_rows_by_label_split():
    glob = {"fc.weight": np.full((4, 2), 9.0), "fc.bias": np.full(4, 9.0)}
    a = {"fc.weight": np.ones((4, 2)), "fc.bias": np.ones(4)}
    b = {"fc.weight": np.full((4, 2), 5.0), "fc.bias": np.full(4, 5.0)}
    masks = [
        {"fc.weight": np.array([1, 0, 1, 0], bool), "fc.bias": np.array([1, 0, 1, 0], bool)},  # a owns classes 0, 2
        {"fc.weight": np.array([1, 1, 0, 0], bool), "fc.bias": np.array([1, 1, 0, 0], bool)},  # b owns classes 0, 1
    ]
    out = count_mean(glob, [a, b], masks)
    # class 0: both -> 3; class 1: only b -> 5; class 2: only a -> 1; class 3: nobody -> 9
    assert out["fc.bias"].tolist() == [3, 5, 1, 9]
    assert out["fc.weight"][:, 0].tolist() == [3, 5, 1, 9]


def test_extract_takes_leading_blocks_and_rejects_bigger_shapes():
    glob = {"w": np.arange(12.0).reshape(3, 4)}
    assert extract(glob, {"w": (2, 2)})["w"].tolist() == [[0, 1], [4, 5]]
    with pytest.raises(AggregationError, match="w: sub-model shape"):
        extract(glob, {"w": (4, 1)})


def test_preresnet_sub_model_is_aligned_through_blocks_and_shortcuts():
    torch.manual_seed(0)
    big = build_model(PreResNetConfig(rate=1.0, norm="none"), (3, 8, 8), 10).eval()
    small = build_model(PreResNetConfig(rate=0.5, norm="none"), (3, 8, 8), 10).eval()
    shapes = {k: tuple(v.shape) for k, v in small.state_dict().items()}
    # The stage-2 shortcut maps the block input (stage 1: 32 channels at rate 1/2) to 64 outputs.
    assert shapes["layers.2.shortcut.weight"] == (64, 32, 1, 1)
    glob = {k: v.numpy() for k, v in big.state_dict().items()}
    sub = extract(glob, shapes)
    # Zero every global entry outside the sub-model: the extra channels then carry exact zeros, so the
    # wide network computes exactly what the sub-model computes iff the index sets line up layer by layer.
    zeroed = {}
    for k, v in glob.items():
        z = np.zeros_like(v)
        z[tuple(slice(0, n) for n in shapes[k])] = sub[k]
        zeroed[k] = torch.from_numpy(z)
    big.load_state_dict(zeroed)
    small.load_state_dict({k: torch.from_numpy(v) for k, v in sub.items()})
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(big(x), small(x), rtol=1e-5, atol=1e-5)


def context(input_shape, num_clients=10, memory=None, hist=None):
    costs = CostCache()
    cost_of = lambda v: costs.get(v, lambda: build_model(v, input_shape, 10), input_shape)
    return FederationContext(
        seed=0,
        num_clients=num_clients,
        num_classes=10,
        input_shape=input_shape,
        num_examples=np.full(num_clients, 10),
        label_histogram=lambda: np.ones((num_clients, 10)) if hist is None else hist,
        param_names=frozenset(),
        memory_bytes=np.full(num_clients, 2.0**40) if memory is None else memory,
        test_split=None,
        cost_of=cost_of,
        training_memory=lambda v: cost_of(v).training_memory(10, 0),  # the default federation: batch 10, plain SGD
    )


def test_cnn_counts_match_table_1():
    # HeteroFL Table 1 (MNIST CNN, 28x28): parameters (printed as 1.6 M, 391 K, 99 K, 25 K, 7 K, so
    # "within rounding" is half the last printed digit), FLOPs per level, and the Ratio of mixes.
    table = {
        "a": (1.6e6, 0.05e6, 80.5e6),
        "b": (391e3, 500, 20.5e6),
        "c": (99e3, 500, 5.3e6),
        "d": (25e3, 500, 1.4e6),
        "e": (7e3, 500, 400e3),
    }
    cfg = parse_config(
        {"algorithm": {"name": "heterofl", "levels": "a1-b1-c1-d1-e1"}, "model": {"name": "cnn", "norm": "sbn"}}
    )
    summary = HeteroFLPolicy(cfg, context((1, 28, 28))).summary()
    for name, (params, rounding, flops) in table.items():
        got = summary["levels"][name]
        assert abs(got["params"] - params) <= rounding, (name, got["params"])
        assert abs(got["forward_flops"] - flops) / flops < 0.10, (name, got["forward_flops"])
    assert round(summary["model_size_ratio"], 2) == 0.27 and abs(summary["mean_params"] - 416e3) < 500
    assert abs(summary["mean_forward_flops"] - 21.6e6) / 21.6e6 < 0.10  # Table 1: a-b-c-d-e 21.6 M FLOPs
    a_e = HeteroFLPolicy(
        cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(update={"levels": "a1-e1"})}), context((1, 28, 28))
    ).summary()
    assert round(a_e["model_size_ratio"], 2) == 0.50 and abs(a_e["mean_params"] - 782e3) < 500


def test_fix_and_capability_assignment():
    assert assign_fix(parse_levels("a2-b8"), 100).tolist() == [0] * 20 + [1] * 80
    assert assign_fix(parse_levels("a1-e1"), 5).tolist() == [0, 0, 1, 1, 1]  # the remainder gets the last
    levels = parse_levels("a1-b1-e1")
    assert assign_capability(levels, [100, 30, 5], np.array([200, 50, 10, 1])).tolist() == [0, 1, 2, -1]


def test_dynamic_levels_are_redrawn_each_round_in_proportion():
    cfg = parse_config(
        {"algorithm": {"name": "heterofl", "levels": "a1-e3", "mode": "dynamic"}, "model": {"name": "mlp"}}
    )
    policy = HeteroFLPolicy(cfg, context((64,), num_clients=50))
    draws = np.array([[policy.level_of(r, c) for c in range(50)] for r in range(1, 41)])
    assert abs((draws == 1).mean() - 0.75) < 0.05
    assert (draws[0] != draws[1]).any() and policy.level_of(3, 7) == draws[2, 7]


def test_capability_mode_gives_the_widest_level_that_fits_memory():
    cfg = parse_config(
        {
            "algorithm": {"name": "heterofl", "levels": "a1-b1-e1", "mode": "capability"},
            "model": {"name": "mlp", "hidden": [256, 256]},
        }
    )
    ctx = context((64,), num_clients=3, memory=np.array([2.0**30, 0.0, 1.0]))
    need_e = ctx.cost_of(cfg.model.model_copy(update={"rate": 0.0625, "scaler": 0.0625})).training_memory(10, 0)
    ctx = context((64,), num_clients=3, memory=np.array([2.0**30, need_e, need_e - 1]))
    policy = HeteroFLPolicy(cfg, ctx)
    assert [policy.level_of(1, c) for c in range(3)] == [0, 2, -1]
    assert policy.select(policy.init_state({}), 1, [0, 1, 2], policy.config.federation.clients_per_round) == [0, 1]
    with pytest.raises(ConfigError, match="no client's memory budget fits"):
        HeteroFLPolicy(cfg, context((64,), num_clients=3, memory=np.zeros(3)))


def test_masked_cross_entropy_fills_absent_classes():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    mask = torch.tensor([True, False, True])
    y = torch.tensor([0])
    zero = F.cross_entropy(masked_logits(logits, mask, "zero"), y)
    assert float(zero) == pytest.approx(-1 + math.log(math.exp(1) + math.exp(0) + math.exp(3)))
    inf = F.cross_entropy(masked_logits(logits, mask, "-inf"), y)
    assert float(inf) == pytest.approx(-1 + math.log(math.exp(1) + math.exp(3)))
    assert torch.equal(masked_logits(logits, mask, "none"), logits)


def test_heterofl_round_trains_narrow_clients_cheaper(tmp_path):
    cfg = parse_config(
        {
            "algorithm": {"name": "heterofl", "levels": "a1-e1", "mode": "fix"},
            "model": {"name": "cnn", "norm": "sbn"},
            "data": {"partition": {"kind": "shards", "classes_per_client": 2}},
            "federation": {"rounds": 3, "grad_clip": 1.0},
            "devices": {"profile": "uniform"},
        }
    )
    summary = run_local(cfg, tmp_path)
    clients = pd.read_parquet(tmp_path / "clients.parquet")
    metrics = pd.read_parquet(tmp_path / "metrics.parquet")
    assert set(clients["model_rate"]) == {1.0, 0.0625}
    wide, narrow = (clients[clients.model_rate == r] for r in (1.0, 0.0625))
    per_sample = lambda df: (df.flops / df.num_samples).iloc[0]
    assert per_sample(narrow) < per_sample(wide) / 50 and narrow.bytes_down.max() < wide.bytes_down.min() / 50
    assert {"test_accuracy@a", "test_accuracy@e", "test_accuracy_local"} <= set(metrics.columns)
    assert summary["levels"]["e"]["params"] < summary["levels"]["a"]["params"] / 100
    # Clients own at most 2 classes: masked local accuracy beats the unmasked global one.
    assert metrics["test_accuracy_local"].iloc[-1] > metrics["test_accuracy"].iloc[-1]


def test_sbn_calibration_can_use_a_sample_of_clients():
    cfg = parse_config(
        {
            "algorithm": {"name": "heterofl", "levels": "a1", "sbn_clients": 0.25},
            "model": {"name": "mlp"},
            "federation": {"batch_size": 4},
        }
    )
    policy = HeteroFLPolicy(cfg, context((64,), num_clients=8))
    # 8 clients of 10 samples each; a sample's input is its index, so batches show whose data they hold.
    pool = Dataset(
        "indices",
        np.arange(80, dtype=np.float32)[:, None],
        np.zeros(80, np.int64),
        np.zeros((1, 1), np.float32),
        np.zeros(1, np.int64),
        10,
    )
    train = Partitioned(pool, [np.arange(10 * c, 10 * c + 10) for c in range(8)])
    batches = policy.calibration_batches(3, train)
    used = np.concatenate(batches).ravel()
    owners = set(used // 10)
    assert len(owners) == 2 and len(used) == 20  # a quarter of 8 clients, all their samples
    assert all(len(b) > 1 for b in batches)
    assert all(np.array_equal(a, b) for a, b in zip(batches, policy.calibration_batches(3, train)))  # seeded by round
    assert (
        len(
            np.concatenate(
                HeteroFLPolicy(
                    parse_config({"algorithm": {"name": "heterofl", "levels": "a1"}, "model": {"name": "mlp"}}),
                    context((64,), num_clients=8),
                ).calibration_batches(3, train)
            )
        )
        == 80
    )


def test_size_ratio_follows_the_clients_actually_dealt_each_level():
    cfg = parse_config(
        {"algorithm": {"name": "heterofl", "levels": "a1-e1", "mode": "fix"}, "model": {"name": "cnn", "norm": "sbn"}}
    )
    summary = HeteroFLPolicy(cfg, context((1, 28, 28), num_clients=5)).summary()  # fix deals a, a, e, e, e
    a, e = summary["levels"]["a"]["params"], summary["levels"]["e"]["params"]
    assert summary["mean_params"] == pytest.approx((2 * a + 3 * e) / 5)


def test_the_client_trains_on_the_masked_cross_entropy():
    # Sec. 3.2: a client holding classes {0, 2} trains on logits whose absent classes are filled
    # (with 0, as the public code); its loss differs from the plain cross-entropy.
    from rayfl.algorithms.heterofl import HeteroFLClient, HeteroFLTask
    from rayfl.algorithms.local import ClientContext
    from rayfl.models import ModelCache
    from rayfl.optim import OptimizerSpec

    cfg = parse_config({"algorithm": {"name": "heterofl", "levels": "a1"}, "model": {"name": "mlp", "hidden": []}})
    proc = HeteroFLClient(cfg)
    task = HeteroFLTask(
        client_id=0,
        round=1,
        weights={"1.weight": np.zeros((3, 2), np.float32), "1.bias": np.zeros(3, np.float32)},
        model=cfg.model,
        local_epochs=1,
        batch_size=2,
        optimizer=OptimizerSpec("sgd", 0.1),
        label_split=(0, 2),
    )
    state = proc.init(task, ClientContext(0, ModelCache((2,), 3)))
    logits, y = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([0])
    by_hand = -1 + math.log(math.exp(1) + math.exp(0) + math.exp(3))
    assert float(proc.loss(state, logits, y)) == pytest.approx(by_hand)
    assert float(F.cross_entropy(logits, y)) != pytest.approx(by_hand)


@pytest.mark.parametrize("rows, expected", [(True, [3, 5, 1, 9]), (False, [3, 3, 3, 3])])
def test_classifier_rows_by_label_split_is_its_own_switch(rows, expected):
    # mask: none (no masked loss) with label_split_rows on or off: the row restriction follows
    # label_split_rows alone. Clients a (classes 0, 2) and b (0, 1) send rows of 1 and 5.
    cfg = parse_config(
        {
            "algorithm": {"name": "heterofl", "levels": "a1", "mask": "none", "label_split_rows": rows},
            "model": {"name": "mlp", "hidden": []},
        }
    )
    ctx = dataclasses.replace(
        context((2,), num_clients=2), num_classes=4, label_histogram=lambda: np.array([[5, 0, 5, 0], [5, 5, 0, 0]])
    )
    policy = HeteroFLPolicy(cfg, ctx)
    state = policy.init_state({"1.weight": np.full((4, 2), 9.0, np.float32), "1.bias": np.full(4, 9.0, np.float32)})
    results = [
        ClientResult(
            client_id=c,
            round=1,
            weights={"1.weight": np.full((4, 2), v, np.float32), "1.bias": np.full(4, v, np.float32)},
            num_examples=10,
            num_samples=10,
            train_loss=0.0,
        )
        for c, v in ((0, 1.0), (1, 5.0))
    ]
    out = aggregated(policy, state, 1, results)
    # on: class 0 both (3), class 1 only b (5), class 2 only a (1), class 3 nobody (9); off: every row held by both
    assert out.weights["1.bias"].tolist() == expected and out.weights["1.weight"][:, 1].tolist() == expected


def test_heterofl_takes_static_batch_norm_unless_the_config_names_a_norm():
    # the paper's Sec. 3.2, an algorithm default (`RECIPE`): with tracked running statistics the
    # global model of the default run stays at chance
    for name in ("heterofl", "alllarge", "allsmall", "exclusivefl"):
        assert parse_config({"algorithm": {"name": name}}).model.norm == "sbn", name
    assert parse_config({"algorithm": {"name": "heterofl"}, "model": {"norm": "bn"}}).model.norm == "bn"
    assert parse_config({"algorithm": {"name": "heterofl"}, "model": {"name": "mlp"}}).model.norm == "sbn"
    assert parse_config({"algorithm": {"name": "fedavg"}}).model.norm == "bn"  # other algorithms keep the family's
    assert parse_config({"algorithm": {"name": "heterofl"}, "model": {"name": "transformer"}}).model.norm == "ln"

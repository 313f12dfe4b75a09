"""Partitioners: coverage, skew, HeteroFL's shards."""

import numpy as np
import pytest

from rayfl.config import ConfigError
from rayfl.data import partition
from rayfl.data.partition import dirichlet_balanced, dirichlet_unbalanced, iid, shards
from rayfl.load import parse_config


def cfg(**partition_spec):
    return parse_config({"data": {"num_clients": 20, "partition": partition_spec}}).data


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "iid"},
        {"kind": "dirichlet", "alpha": 0.5},
        {"kind": "dirichlet", "alpha": 0.1, "min_size": 5},
        {"kind": "dirichlet", "alpha": 0.5, "balanced": True},
        {"kind": "noniid_level", "p": 10},
        {"kind": "noniid_level", "p": 0},
    ],
)
def test_every_sample_goes_to_exactly_one_client(digits, spec):
    p = partition(digits, cfg(**spec), seed=3)
    assigned = np.concatenate(p.parts)
    assert len(assigned) == len(digits.y_train)
    assert np.array_equal(np.sort(assigned), np.arange(len(digits.y_train)))
    assert p.label_histogram().sum() == len(digits.y_train)
    assert np.array_equal(p.label_histogram().sum(0), np.bincount(digits.y_train, minlength=10))
    # the vectorized histogram is each client's own label count
    assert np.array_equal(p.label_histogram(), [np.bincount(digits.y_train[part], minlength=10) for part in p.parts])


def test_balanced_partitions_give_equal_sizes(digits):
    n = len(digits.y_train)
    for spec in (
        {"kind": "iid"},
        {"kind": "dirichlet", "alpha": 0.3, "balanced": True},
        {"kind": "noniid_level", "p": 5},
    ):
        sizes = partition(digits, cfg(**spec), seed=0).sizes()
        assert sizes.max() - sizes.min() <= 1 and sizes.sum() == n


def skew(histogram: np.ndarray) -> float:
    """Mean total-variation distance between each client's label mix and the global mix."""
    glob = histogram.sum(0) / histogram.sum()
    mixes = histogram / histogram.sum(1, keepdims=True)
    return float(np.mean(0.5 * np.abs(mixes - glob).sum(1)))


@pytest.mark.parametrize("balanced", [False, True])
def test_dirichlet_label_skew_grows_as_alpha_shrinks(digits, balanced):
    y = digits.y_train
    mean_skew = []
    for alpha in (100.0, 1.0, 0.1):
        values = []
        for seed in range(5):
            g = np.random.default_rng(seed)
            parts = (
                dirichlet_balanced(y, 20, alpha, g, 10) if balanced else dirichlet_unbalanced(y, 20, alpha, 1, g, 10)
            )
            values.append(skew(np.stack([np.bincount(y[p], minlength=10) for p in parts])))
        mean_skew.append(np.mean(values))
    assert mean_skew[0] < mean_skew[1] < mean_skew[2]
    assert mean_skew[0] < 0.3 and mean_skew[2] > 0.6
    iid_skew = skew(np.stack([np.bincount(y[p], minlength=10) for p in iid(y, 20, np.random.default_rng(0))]))
    assert iid_skew < mean_skew[1]


def test_min_size_is_respected_and_impossible_requests_fail(digits):
    p = partition(digits, cfg(kind="dirichlet", alpha=0.3, min_size=25), seed=1)
    assert p.sizes().min() >= 25
    with pytest.raises(ConfigError) as refused:
        partition(digits, cfg(kind="dirichlet", alpha=0.5, min_size=100), seed=1)
    # the line names the fix that works: as many clients as hold min_size each
    fits = int(str(refused.value).split("at most ")[1].split(",")[0])
    assert str(refused.value).startswith("data.num_clients: 20 clients x data.partition.min_size 100 exceeds the ")
    assert fits == len(digits.y_train) // 100 < 20
    spec = {"kind": "dirichlet", "alpha": 0.5, "min_size": 100}
    data = {"num_clients": fits // 2, "partition": spec}  # (at most: a bound; Dirichlet's draws vary)
    fewer = parse_config({"data": data, "federation": {"clients_per_round": 2}}).data
    assert partition(digits, fewer, seed=1).sizes().min() >= 100


def test_noniid_level_is_balanced_dirichlet_with_alpha_one_over_p(digits):
    a = partition(digits, cfg(kind="noniid_level", p=4), seed=7)
    b = partition(digits, cfg(kind="dirichlet", alpha=0.25, balanced=True, min_size=0), seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a.parts, b.parts))


def test_shards_give_at_most_k_classes_and_a_matching_test_split(digits):
    p = partition(digits, cfg(kind="shards", classes_per_client=2), seed=0)
    train_classes = [set(np.unique(digits.y_train[t])) for t in p.parts]
    test_classes = [set(np.unique(digits.y_test[t])) for t in p.test_split]
    assert all(1 <= len(c) <= 2 for c in train_classes)
    assert train_classes == test_classes
    for split in (p.parts, p.test_split):
        used = np.concatenate(split)
        assert len(used) == len(np.unique(used))  # no sample twice


def test_shards_hand_example():
    # 4 clients, 2 classes, k = 1: each class is cut into k*N/C = 2 contiguous shards.
    y = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    y_test = np.array([0, 0, 1, 1])
    train, test = shards(y, y_test, 4, 1, np.random.default_rng(0), 2)
    as_sets = sorted(tuple(t) for t in train)
    assert as_sets == [(0, 1), (2, 3), (4, 5, 6), (7, 8, 9)]
    assert sorted(tuple(t) for t in test) == [(0,), (1,), (2,), (3,)]
    for tr, te in zip(train, test):
        assert set(y[tr]) == set(y_test[te])


def test_shards_need_a_whole_number_of_shards_per_class(digits):
    data = parse_config(
        {
            "data": {"num_clients": 7, "partition": {"kind": "shards", "classes_per_client": 3}},
            "federation": {"clients_per_round": 5},
        }
    ).data
    with pytest.raises(ConfigError, match="classes_per_client: 3 x 7 clients must be a multiple of the 10 classes"):
        partition(digits, data, seed=0)


def test_same_seed_same_partition_other_seed_other_partition(digits):
    c = cfg(kind="dirichlet", alpha=0.5)
    a, b, other = (partition(digits, c, s) for s in (4, 4, 5))
    assert all(np.array_equal(x, y) for x, y in zip(a.parts, b.parts))
    assert not all(np.array_equal(x, y) for x, y in zip(a.parts, other.parts))

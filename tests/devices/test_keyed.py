"""Per-client draws keyed by (seed, purpose, client) for populations too large for N-long arrays
(`rayfl.rng`: `KeyedPermutation`, `keyed_uniform`, `Column`; used above `rng.EAGER_CLIENTS`)."""

import numpy as np
import pytest
from scipy import stats

from rayfl import rng
from rayfl.data import load_clients
from rayfl.devices.population import Population
from rayfl.devices.profile import load_profile
from rayfl.load import parse_config


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 4097])
def test_a_keyed_permutation_is_a_bijection_of_0_to_n(n):
    image = rng.KeyedPermutation(n, seed=0, purpose="devices")(np.arange(n))
    assert sorted(image.tolist()) == list(range(n))


def test_a_keyed_permutation_depends_on_its_key_and_looks_shuffled():
    points = np.arange(10_000)
    a = rng.KeyedPermutation(10_000, 0, "devices")(points)
    assert not np.array_equal(a, rng.KeyedPermutation(10_000, 1, "devices")(points))
    assert not np.array_equal(a, rng.KeyedPermutation(10_000, 0, "other")(points))
    assert abs(stats.spearmanr(points, a).statistic) < 0.05  # no trace of the identity's order
    assert np.array_equal(
        rng.KeyedPermutation(10**9, 0, "devices")(np.array([5, 7])),
        rng.KeyedPermutation(10**9, 0, "devices")(np.array([7, 5]))[::-1],
    )


def test_keyed_uniforms_are_uniform_and_a_function_of_the_client_alone():
    u = rng.keyed_uniform(3, "sizes", np.arange(100_000))
    assert 0 < u.min() and u.max() < 1 and stats.kstest(u, "uniform").pvalue > 0.01
    assert np.array_equal(rng.keyed_uniform(3, "sizes", np.array([99_999, 5])), u[[99_999, 5]])


@pytest.fixture
def keyed(monkeypatch):
    """Every population above the eager limit: the keyed path at a size a test can check whole."""
    monkeypatch.setattr(rng, "EAGER_CLIENTS", 0)


def test_keyed_classes_keep_the_profiles_exact_proportions(keyed, monkeypatch):
    profile = load_profile("jetson")  # 3 classes
    pop = Population(profile, 1001, seed=0)
    assert isinstance(pop.class_of, rng.Column)
    classes = np.asarray(pop.class_of)
    monkeypatch.setattr(rng, "EAGER_CLIENTS", 10**7)
    dealt = Population(profile, 1001, seed=0).class_of
    assert isinstance(dealt, np.ndarray) and not np.array_equal(dealt, classes)  # another shuffle ...
    assert (
        np.bincount(classes).tolist() == np.bincount(dealt).tolist()
    )  # ... of the same exact counts (largest remainder)
    assert [pop.class_of[k] for k in (0, 500, 1000)] == classes[[0, 500, 1000]].tolist()
    assert pop.device_class(7).name == profile.classes[classes[7]].name
    assert pop.static and len(pop.available(1)) == 1001


def test_keyed_synthetic_sizes_follow_fedprox_lognormal(keyed):
    data = parse_config({"data": {"name": "synthetic", "num_clients": 20_000}}).data
    clients = load_clients(data, seed=0)
    total = np.asarray(clients.total)
    # lognormal(4, 2) + 50, capped at 20 x mean_samples: its median is e^4 + 50
    assert abs(np.median(total) - (np.exp(4) + 50)) / (np.exp(4) + 50) < 0.05
    assert total.max() <= 20 * data.synthetic.mean_samples
    assert clients.sizes()[123] == total[123] - total[123] // 5 and len(clients.train(123)[1]) == clients.sizes()[123]

"""Dataset loaders: shapes, offline generation, clear errors for missing files."""

import numpy as np
import pytest

from rayfl.config import ConfigError
from rayfl.data import load_clients, load_dataset, partition
from rayfl.load import parse_config


def test_digits_is_embedded_and_its_test_split_is_fixed(digits):
    assert digits.input_shape == (1, 8, 8)
    assert len(digits.y_train) + len(digits.y_test) == 1797
    assert np.array_equal(np.bincount(digits.y_test), np.bincount(load_dataset(parse_config({}).data, seed=9).y_test))
    assert abs(digits.x_train.mean()) < 1e-4 and abs(digits.x_train.std() - 1) < 1e-3


def test_mnist1d_is_generated_locally():
    ds = load_dataset(parse_config({"data": {"name": "mnist1d"}}).data, seed=0)
    assert ds.input_shape == (1, 40) and ds.num_classes == 10
    assert (len(ds.y_train), len(ds.y_test)) == (4000, 1000)
    assert set(np.unique(ds.y_train)) == set(range(10))


def test_synthetic_clients_are_generated_on_demand_from_their_own_keys():
    data = parse_config(
        {
            "data": {"name": "synthetic", "num_clients": 8, "synthetic": {"alpha": 1, "beta": 1}},
            "federation": {"clients_per_round": 4},
        }
    ).data
    assert data.partition.kind == "natural"  # the source's own partition when none is named
    clients = load_clients(data, seed=0)
    assert clients.input_shape == (60,) and clients.num_clients == 8
    x, y = clients.train(3)
    assert x.shape == (clients.sizes()[3], 60) and x.dtype == np.float32 and y.dtype == np.int64
    again = load_clients(data, seed=0).train(3)  # a client's data depends on (seed, client) alone
    assert np.array_equal(x, again[0]) and np.array_equal(y, again[1])
    # 20% of every client's samples are held out: with 8 clients the test set holds all of theirs.
    x_test, y_test = clients.test_set(eval_clients=1000)
    assert len(y_test) == int((clients.total // 5).sum()) and abs(len(y_test) / clients.sizes().sum() - 0.25) < 0.02
    # With more clients than eval_clients, a seeded sample of clients is evaluated on.
    assert len(clients.test_set(eval_clients=2)[1]) < len(y_test)
    # Different clients follow different models: their label mixes differ.
    hist = clients.label_histogram() / clients.sizes()[:, None]
    assert np.abs(hist[0] - hist[1]).sum() > 0.2
    with pytest.raises(
        ConfigError, match="data.partition.kind: synthetic generates each client's own data; use natural"
    ):
        load_clients(parse_config({"data": {"name": "synthetic", "partition": {"kind": "iid"}}}).data, seed=0)


def test_a_sampled_partition_draws_each_client_when_asked(digits):
    data = parse_config(
        {
            "data": {
                "num_clients": 1_000_000,
                "partition": {"kind": "sampled", "mix": "dirichlet", "alpha": 0.1, "size": 40},
            }
        }
    ).data
    clients = partition(digits, data, seed=0)
    assert clients.sizes().shape == (1_000_000,) and (clients.sizes() == 40).all()
    idx = clients.indices(999_999)
    assert len(idx) == 40 and len(np.unique(idx)) == 40  # no sample twice within a client
    assert np.array_equal(idx, partition(digits, data, seed=0).indices(999_999))  # keyed by (seed, client)
    mixes = [np.bincount(digits.y_train[clients.indices(k)], minlength=10) for k in range(20)]
    assert np.mean([m.max() for m in mixes]) > 20  # Dir(0.1): most of a client's samples in one class
    iid = partition(
        digits,
        parse_config({"data": {"num_clients": 50, "partition": {"kind": "sampled", "mix": "iid", "size": 40}}}).data,
        seed=0,
    )
    assert np.mean([np.bincount(digits.y_train[iid.indices(k)], minlength=10).max() for k in range(20)]) < 12


def test_missing_torchvision_set_says_where_it_looked(tmp_path):
    data = parse_config({"data": {"name": "cifar10", "data_dir": str(tmp_path)}}).data
    with pytest.raises(ConfigError, match=f"data.data_dir: cifar10 not found under {tmp_path}.*download: true"):
        load_dataset(data, seed=0)
    with pytest.raises(ConfigError, match="data.data_dir: required for mnist"):
        load_dataset(parse_config({"data": {"name": "mnist"}}).data, seed=0)


def test_unknown_dataset_is_a_config_error():
    with pytest.raises(ConfigError, match="data.name: unknown dataset 'imagenet'"):
        load_dataset(parse_config({"data": {"name": "imagenet"}}).data, seed=0)

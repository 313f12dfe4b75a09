"""Dataset loaders: shapes, offline generation, clear errors for missing files."""

import numpy as np
import pytest

from rayfl.config import ConfigError
from rayfl.loader import parse_config
from rayfl.data import load_dataset, partition


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


def test_synthetic_has_natural_clients_covering_the_training_set():
    data = parse_config({"data": {"name": "synthetic", "num_clients": 8, "partition": {"kind": "natural"}, "synthetic": {"alpha": 1, "beta": 1}}, "federation": {"clients_per_round": 4}}).data
    ds = load_dataset(data, seed=0)
    assert ds.input_shape == (60,)
    p = partition(ds, data, seed=0)
    assert np.array_equal(np.sort(np.concatenate(p.train)), np.arange(len(ds.y_train)))
    # 20% of every client's samples are held out: the test set is a quarter of the train set, within rounding.
    assert abs(len(ds.y_test) / len(ds.y_train) - 0.25) < 0.02
    # Different clients follow different models: their label mixes differ.
    hist = p.label_histogram() / p.sizes()[:, None]
    assert np.abs(hist[0] - hist[1]).sum() > 0.2


def test_missing_torchvision_set_says_where_it_looked(tmp_path):
    data = parse_config({"data": {"name": "cifar10", "data_dir": str(tmp_path)}}).data
    with pytest.raises(ConfigError, match=f"data.data_dir: cifar10 not found under {tmp_path}.*download: true"):
        load_dataset(data, seed=0)
    with pytest.raises(ConfigError, match="data.data_dir: required for mnist"):
        load_dataset(parse_config({"data": {"name": "mnist"}}).data, seed=0)


def test_unknown_dataset_is_a_config_error():
    with pytest.raises(ConfigError, match="data.name: unknown dataset 'imagenet'"):
        load_dataset(parse_config({"data": {"name": "imagenet"}}).data, seed=0)

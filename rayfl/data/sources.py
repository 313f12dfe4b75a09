"""Data sources by name: embedded (`digits`), generated (`mnist1d`; `synthetic` in `clients`), torchvision.

A pooled source's loader returns a `Dataset` with float32 inputs shaped (N, *input_shape),
int64 labels and a held-out central test set, which a partition then deals to clients; a
generated federation's loader returns its `Clients` directly. torchvision is imported only by
the loaders that need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import catalog
from ..config import ConfigError, DataConfig


@dataclass(frozen=True, eq=False)
class Dataset:
    """A pooled dataset: train and test arrays."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    columns: Any = None
    """The training split's other columns where a source has them (a Hugging Face dataset's,
    as a `datasets.Dataset` without its input column): for `natural` by a column and for Flower
    Datasets' partitioners."""

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


@dataclass(frozen=True)
class Source:
    name: str
    load: Callable[[DataConfig, int], Any]
    """`load(config, seed)`: a pooled `Dataset`, or a generated federation's `Clients`."""
    summary: str
    """One line for `rayfl list` (the built-ins' copied to `rayfl/catalog_builtin.py`)."""
    partition: str = "dirichlet"
    """The partition kind a config that names none takes (`natural` for a generated federation)."""


_SOURCES: dict[str, Source] = {}


def source(
    name: str, summary: str, partition: str = "dirichlet"
) -> Callable[[Callable[[DataConfig, int], Any]], Callable]:
    """Decorator: register `load(config, seed)` under `name`, with its one-line `summary`."""

    def wrap(load: Callable[[DataConfig, int], Any]) -> Callable[[DataConfig, int], Any]:
        _SOURCES[name] = Source(name, load, summary, partition)
        return load

    return wrap


def sources() -> dict[str, Source]:
    return dict(_SOURCES)


def load_dataset(config: DataConfig, seed: int) -> Any:
    """Load the configured source (a `Dataset`, or a generated federation's `Clients`); unknown
    names and missing files raise `ConfigError`."""
    if config.name not in _SOURCES:
        raise ConfigError(f"data.name: {catalog.unknown('dataset', config.name, _SOURCES)}")
    return _SOURCES[config.name].load(config, seed)


def _standardize(x_train: np.ndarray, x_test: np.ndarray, axis: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Scale both splits by the training set's mean and standard deviation over `axis`."""
    mean = x_train.mean(axis=axis, keepdims=True)
    std = x_train.std(axis=axis, keepdims=True) + 1e-8
    return ((x_train - mean) / std).astype(np.float32), ((x_test - mean) / std).astype(np.float32)


@source("digits", "scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes); no download")
def load_digits(config: DataConfig, seed: int) -> Dataset:
    """The embedded default. The 25% test split is fixed (stratified, independent of the run seed)."""
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    bunch = sk_digits()
    x = bunch.images.astype(np.float32)[:, None, :, :]
    y = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, stratify=y, random_state=0)
    x_tr, x_te = _standardize(x_tr, x_te, axis=(0, 1, 2, 3))
    return Dataset("digits", x_tr, y_tr, x_te, y_te, 10)


@source("mnist1d", "MNIST-1D (Greydanus 2020), generated locally with the mnist1d package; 4000/1000, length 40")
def load_mnist1d(config: DataConfig, seed: int) -> Dataset:
    """The canonical MNIST-1D (the package's default arguments, seed 42), generated, never downloaded."""
    from mnist1d.data import get_dataset_args, make_dataset

    state = np.random.get_state()  # make_dataset seeds numpy's global RNG; leave it as it was
    try:
        data = make_dataset(get_dataset_args())
    finally:
        np.random.set_state(state)
    x_tr = data["x"].astype(np.float32)[:, None, :]
    x_te = data["x_test"].astype(np.float32)[:, None, :]
    return Dataset("mnist1d", x_tr, data["y"].astype(np.int64), x_te, data["y_test"].astype(np.int64), 10)


_TORCHVISION = {
    # name: (torchvision class, classes, per-channel mean, per-channel std)
    "mnist": ("MNIST", 10, (0.1307,), (0.3081,)),
    "fashion_mnist": ("FashionMNIST", 10, (0.2860,), (0.3530,)),
    "cifar10": ("CIFAR10", 10, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": ("CIFAR100", 100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def _load_torchvision(config: DataConfig, seed: int) -> Dataset:
    """A torchvision set read from `data_dir`; downloaded only with `data.download: true`."""
    cls_name, num_classes, mean, std = _TORCHVISION[config.name]
    if config.data_dir is None:
        raise ConfigError(f"data.data_dir: required for {config.name} (where its torchvision files live)")
    root = Path(config.data_dir).expanduser().resolve()
    import torchvision

    cls = getattr(torchvision.datasets, cls_name)
    try:
        splits = [cls(root=str(root), train=train, download=config.download) for train in (True, False)]
    except RuntimeError as exc:
        hint = "" if config.download else " (set data.download: true where a network exists)"
        raise ConfigError(f"data.data_dir: {config.name} not found under {root}{hint}") from exc
    arrays = []
    for split in splits:
        x = np.asarray(split.data, dtype=np.float32) / 255.0
        x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
        x = (x - np.array(mean, np.float32)[:, None, None]) / np.array(std, np.float32)[:, None, None]
        arrays += [x.astype(np.float32), np.asarray(split.targets, dtype=np.int64)]
    return Dataset(config.name, arrays[0], arrays[1], arrays[2], arrays[3], num_classes)


for _name, (_class, _classes, *_) in _TORCHVISION.items():
    source(_name, f"torchvision {_class} ({_classes} classes) from data.data_dir")(_load_torchvision)

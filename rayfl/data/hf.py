"""Hugging Face datasets as a pooled source: `data: {name: hf, path, split, test_split, features}`.

`path` is a hub id (downloaded and cached by the `datasets` library where a network exists) or
a local folder or file (`datasets.load_dataset` picks its builder: imagefolder for a folder of
class subfolders, csv / json / parquet by extension), so everything works offline on local
files. `features` names the input column (an image, or a text) and the label column:

- an image is decoded, converted to grayscale when the first training image is ("L") else to
  RGB, resized to `image_size` (default: the first training image's), scaled to [0, 1] and
  standardized per channel by the training split's statistics: inputs (C, H, W);
- a text is hashed into `text_dim` token counts by scikit-learn's `HashingVectorizer`
  (stateless, so train and test need no shared vocabulary), l2-normed: inputs (1, text_dim);
- a label column of `ClassLabel` type keeps its ids; any other is mapped to 0..K-1 in sorted
  order of its values over both splits.

Without a test split, the test set is a seeded 20% of the training split (`train_test_split`).
The training split's remaining columns travel with the arrays (`Dataset.columns`) for
`partition: {kind: natural, by: COLUMN}` and Flower Datasets' partitioners (`partition.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError, DataConfig
from .sources import Dataset, _standardize, source

BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}


def load_splits(config: DataConfig, seed: int) -> tuple[Any, Any]:
    """The training and test splits as `datasets.Dataset`s; a path or split the library cannot
    read is a `ConfigError` naming `data.path` or `data.split`."""
    import datasets

    datasets.disable_progress_bars()  # rayfl's own bar is the run's
    datasets.logging.set_verbosity_error()
    path = Path(config.path).expanduser()
    try:
        if path.is_file():
            data = datasets.load_dataset(BUILDERS.get(path.suffix, "csv"), data_files=str(path))
        else:
            data = datasets.load_dataset(config.path)
    except Exception as exc:  # noqa: BLE001 - the library raises many kinds (missing, unreachable, unparsable)
        raise ConfigError(
            f"data.path: {config.path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if config.split not in data:
        raise ConfigError(f"data.split: {config.path} has no split {config.split!r} (splits: {', '.join(data)})")
    train = data[config.split]
    if config.test_split is not None and config.test_split in data and config.test_split != config.split:
        return train, data[config.test_split]
    held = train.train_test_split(test_size=0.2, seed=seed)
    return held["train"], held["test"]


def with_folder_labels(split: Any, config: DataConfig) -> Any:
    """`split` with its images' folder names as the label column, where a local image folder of class
    subfolders has no such column: the `datasets` library drops the folder labels once the folder
    holds a metadata file (a `metadata.csv` naming each image's writer for `partition: {kind:
    natural, by: writer}`). The names map to ids in sorted order, as the library's own labels do."""
    import datasets

    f, root = config.features, Path(config.path).expanduser()
    if f.image is None or f.label in split.column_names or f.image not in split.column_names or not root.is_dir():
        return split
    folders = [
        Path(image["path"]).parent for image in split.cast_column(f.image, datasets.Image(decode=False))[f.image]
    ]
    top = root.resolve()
    if any(folder.resolve() == top for folder in set(folders)):  # an image outside every class folder
        return split
    return split.add_column(f.label, [folder.name for folder in folders])


def check_columns(split: Any, config: DataConfig) -> None:
    f = config.features
    for key, column in (("image", f.image), ("text", f.text), ("label", f.label)):
        if column is not None and column not in split.column_names:
            raise ConfigError(
                f"data.features.{key}: no column {column!r} in {config.path} (columns: {', '.join(split.column_names)})"
            )


def images(split: Any, column: str, mode: str, size: tuple[int, int]) -> np.ndarray:
    """(n, C, H, W) float32 in [0, 1]."""
    h, w = size
    x = np.stack([np.asarray(img.convert(mode).resize((w, h)), dtype=np.float32) / 255.0 for img in split[column]])
    return x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)


def texts(split: Any, column: str, dim: int) -> np.ndarray:
    """(n, 1, dim) float32 hashed token counts, l2-normed."""
    from sklearn.feature_extraction.text import HashingVectorizer

    hashed = HashingVectorizer(n_features=dim, alternate_sign=False, norm="l2").transform(split[column])
    return hashed.toarray().astype(np.float32)[:, None, :]


def labels(train: Any, test: Any, column: str) -> tuple[np.ndarray, np.ndarray, int]:
    feature = train.features[column]
    if hasattr(feature, "num_classes"):  # datasets.ClassLabel
        return np.asarray(train[column], np.int64), np.asarray(test[column], np.int64), int(feature.num_classes)
    values = sorted(set(train[column]) | set(test[column]))
    index = {v: i for i, v in enumerate(values)}
    to_ids = lambda split: np.array([index[v] for v in split[column]], np.int64)
    return to_ids(train), to_ids(test), len(values)


@source(
    "hf",
    "a Hugging Face dataset (data.path: hub id or local folder / file; data.features: image or text, label) "
    "through the datasets library",
)
def load_hf(config: DataConfig, seed: int) -> Dataset:
    """A Hugging Face dataset as pooled arrays (module docstring)."""
    train, test = (with_folder_labels(split, config) for split in load_splits(config, seed))
    check_columns(train, config)
    f = config.features
    if f.image is not None:
        first = train[0][f.image]
        mode = "L" if first.mode in ("L", "1", "I", "I;16", "F") else "RGB"
        size = f.image_size or (first.height, first.width)
        x_train, x_test = _standardize(images(train, f.image, mode, size), images(test, f.image, mode, size), (0, 2, 3))
    else:
        x_train, x_test = texts(train, f.text, f.text_dim), texts(test, f.text, f.text_dim)
    y_train, y_test, num_classes = labels(train, test, f.label)
    if num_classes < 2:
        raise ConfigError(f"data.features.label: {f.label!r} has {num_classes} class; a classifier needs at least 2")
    name = Path(config.path).name or config.path
    return Dataset(
        f"hf:{name}", x_train, y_train, x_test, y_test, num_classes, train.remove_columns([f.image or f.text])
    )

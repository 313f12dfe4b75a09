"""Hugging Face datasets from local files (offline): an image folder and a text CSV, rayfl's
partitioners on them, the natural split by a client column, and a Flower Datasets partitioner."""

import sys
import types

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from rayfl.cli import main
from rayfl.config import ConfigError
from rayfl.data import load_clients, load_dataset
from rayfl.load import load_config

SHAPES = ("circle", "square", "stripe")  # imagefolder's ClassLabel ids: the sorted folder names


def draw(label: str, g: np.random.Generator) -> np.ndarray:
    a = np.zeros((12, 12), np.uint8)
    yy, xx = np.mgrid[:12, :12]
    a[
        {
            "circle": (yy - 6) ** 2 + (xx - 6) ** 2 < 16,
            "square": (abs(yy - 6) < 3) & (abs(xx - 6) < 3),
            "stripe": xx % 3 == 0,
        }[label]
    ] = 255
    return np.clip(a.astype(int) + g.integers(0, 60, a.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root, g = tmp_path_factory.mktemp("images"), np.random.default_rng(0)
    for split, n in (("train", 20), ("test", 6)):
        for label in SHAPES:
            (root / split / label).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(draw(label, g), "L").save(root / split / label / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def text_csv(tmp_path_factory):
    root, g = tmp_path_factory.mktemp("texts"), np.random.default_rng(1)
    words = {"pos": ["good", "great", "fine", "lovely"], "neg": ["bad", "awful", "poor", "dull"]}
    rows = [
        {"text": " ".join(g.choice(words[lab], 3)) + " movie", "label": lab, "writer": f"w{i % 5}"}
        for i, lab in enumerate(["pos", "neg"] * 40)
    ]
    pd.DataFrame(rows).to_csv(root / "reviews.csv", index=False)
    return root / "reviews.csv"


def hf(path, *extra):
    return ["data.name=hf", f"data.path={path}", "federation.clients_per_round=3", *extra]


def test_an_image_folder_loads_with_its_folder_labels(image_folder):
    cfg = load_config(None, hf(image_folder, "data.features.image=image"))
    data = load_dataset(cfg.data, 0)
    assert data.x_train.shape == (60, 1, 12, 12) and data.x_test.shape == (18, 1, 12, 12) and data.num_classes == 3
    # Class ids in folder order: the stripe images (id 2) have a column every third pixel.
    stripes = data.x_train[data.y_train == 2].mean(axis=0)[0]
    assert stripes[:, 0::3].mean() > stripes[:, 1::3].mean() + 1.0
    assert abs(float(data.x_train.mean())) < 1e-4  # standardized by the training split


def test_a_plain_class_folder_with_a_metadata_file_keeps_its_folder_labels_and_splits_by_writer(tmp_path):
    # the README's own-data line: my_images/<class>/*.png, no split folders; a metadata.csv naming
    # each image's writer gives the natural partition its column, and the folder labels stay
    g, rows = np.random.default_rng(2), ["file_name,writer"]
    for label in SHAPES:
        (tmp_path / label).mkdir()
        for i in range(12):
            Image.fromarray(draw(label, g), "L").save(tmp_path / label / f"{i}.png")
            rows.append(f"{label}/{i}.png,w{i % 4}")
    plain = hf(tmp_path, "data.features.image=image", "data.num_clients=4")
    data = load_dataset(load_config(None, plain).data, 0)
    assert data.num_classes == 3 and len(data.y_train) + len(data.y_test) == 36  # a seeded 20% held out
    (tmp_path / "metadata.csv").write_text("\n".join(rows) + "\n")
    natural = load_config(None, [*plain, "data.partition={kind: natural, by: writer}"])
    with_metadata, clients = load_dataset(natural.data, 0), load_clients(natural.data, 0)
    assert np.array_equal(with_metadata.y_train, data.y_train) and np.array_equal(with_metadata.y_test, data.y_test)
    stripes = with_metadata.x_train[with_metadata.y_train == 2].mean(axis=0)[0]  # id 2: the stripe folder
    assert stripes[:, 0::3].mean() > stripes[:, 1::3].mean() + 1.0
    writers = np.asarray(with_metadata.columns["writer"])
    assert [sorted(set(writers[clients.indices(k)])) for k in range(4)] == [[f"w{k}"] for k in range(4)]


def test_the_readmes_own_data_line_runs_on_a_plain_class_folder(tmp_path, monkeypatch):
    # as written, in a folder holding my_images/<class>/*.png (one round, in process, here)
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"\*\*Your own data\.\*\*.*?```bash\n(.*?)```", readme, re.S).group(1)
    words = shlex.split(re.sub(r"#.*", "", block.replace("\\\n", " ")))
    g = np.random.default_rng(3)
    for label in SHAPES:
        (tmp_path / "my_images" / label).mkdir(parents=True)
        for i in range(30):
            Image.fromarray(draw(label, g), "L").save(tmp_path / "my_images" / label / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    assert words[:2] == ["rayfl", "run"] and "./my_images" in block
    assert main([*words[1:], "--local", "--set", "federation.rounds=1", "--out", str(tmp_path / "run")]) == 0


def test_rayfl_run_on_an_image_folder_and_a_text_csv(image_folder, text_csv, tmp_path):
    common = [
        "federation.rounds=5",
        "data.num_clients=4",
        "federation.clients_per_round=4",
        "data.partition.kind=iid",
        "model.name=mlp",
        "federation.local_epochs=2",
    ]
    sets = lambda items: [a for s in items for a in ("--set", s)]
    assert (
        main(
            [
                "run",
                "--local",
                "--out",
                str(tmp_path / "img"),
                *sets(hf(image_folder, "data.features.image=image", *common)),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "run",
                "--local",
                "--out",
                str(tmp_path / "txt"),
                *sets(hf(text_csv, "data.features.text=text", *common, "federation.lr=0.5")),
            ]
        )
        == 0
    )
    for run in (
        "img",
        "txt",
    ):  # hashed texts are l2-normed over 1024 features: small inputs, a larger rate
        # (at 0.05 the loss falls 0.696 -> 0.670 in 20 rounds)
        assert pd.read_parquet(tmp_path / run / "metrics.parquet")["test_accuracy"].iloc[-1] > 0.9


def test_partitions_agree_with_the_labels_and_the_client_column(text_csv):
    cfg = load_config(None, hf(text_csv, "data.features.text=text", "data.num_clients=4", "data.partition.alpha=0.05"))
    clients = load_clients(cfg.data, 0)
    data = load_dataset(cfg.data, 0)
    # Dirichlet: every training sample dealt once, each client's labels those of its samples.
    assert np.array_equal(clients.label_histogram().sum(axis=0), np.bincount(data.y_train, minlength=2))
    assert (
        clients.label_histogram().max(axis=1) >= 0.8 * clients.sizes()
    ).sum() >= 3  # alpha 0.05: nearly one class each
    natural = load_config(
        None,
        hf(text_csv, "data.features.text=text", "data.num_clients=5", "data.partition={kind: natural, by: writer}"),
    )
    clients = load_clients(natural.data, 0)
    writers = np.asarray(data.columns["writer"])
    assert [sorted(set(writers[clients.indices(k)])) for k in range(5)] == [[f"w{k}"] for k in range(5)]
    assert clients.sizes().sum() == len(writers)
    with pytest.raises(ConfigError, match=r"^data.num_clients: 6 clients, but column 'writer' has 5 distinct values"):
        load_clients(
            load_config(
                None,
                hf(
                    text_csv,
                    "data.features.text=text",
                    "data.num_clients=6",
                    "data.partition={kind: natural, by: writer}",
                ),
            ).data,
            0,
        )


def test_a_flower_partitioner_assigns_the_rows_it_returns(text_csv, monkeypatch):
    class EveryKth:  # Flower Datasets' Partitioner interface: num_partitions, .dataset, load_partition
        def __init__(self, num_partitions, offset=0):
            self.n, self.offset, self.dataset = num_partitions, offset, None

        def load_partition(self, k):
            return self.dataset.select(range((k + self.offset) % self.n, len(self.dataset), self.n))

    module = types.ModuleType("flwr_datasets.partitioner")
    module.EveryKth = EveryKth
    monkeypatch.setitem(sys.modules, "flwr_datasets", types.ModuleType("flwr_datasets"))
    monkeypatch.setitem(sys.modules, "flwr_datasets.partitioner", module)
    cfg = load_config(
        None,
        hf(
            text_csv,
            "data.features.text=text",
            "data.num_clients=3",
            "data.partition={kind: flwr, partitioner: EveryKth, offset: 1}",
        ),
    )
    clients = load_clients(cfg.data, 0)
    n = len(load_dataset(cfg.data, 0).y_train)
    assert [clients.indices(k).tolist() for k in range(3)] == [list(range((k + 1) % 3, n, 3)) for k in range(3)]
    with pytest.raises(ConfigError, match=r"^data.partition.partitioner: flwr_datasets.partitioner has no 'Nope'"):
        load_clients(
            load_config(
                None, hf(text_csv, "data.features.text=text", "data.partition={kind: flwr, partitioner: Nope}")
            ).data,
            0,
        )


@pytest.mark.parametrize(
    "extra, message",
    [
        (["data.features.text=body"], "data.features.text: no column 'body'"),
        (["data.features.text=text", "data.split=validation"], "data.split:"),
        (["data.features={label: label}"], "data.features: name one input column"),
    ],
)
def test_bad_hf_input_is_one_line(text_csv, tmp_path, extra, message, capsys):
    sets = [a for s in hf(text_csv, *extra) for a in ("--set", s)]
    assert main(["run", "--local", "--out", str(tmp_path / "r"), *sets]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not (tmp_path / "r").exists()

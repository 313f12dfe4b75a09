"""What rayfl offers, by name and one line each, readable without importing torch: the
source of `rayfl list`, of the summaries the registries show, and of the "did you mean"
suggestions for a misspelt name or key.

Every dataset and model family registers its implementation under a name listed here (its
registry refuses an unlisted one). An algorithm carries its own summary in its registration;
the built-in ones are copied to `rayfl/catalog_algorithms.py` (`python -m rayfl.algorithms`).
`tests/test_usersday.py` checks both agree with the registries both ways. A built-in device
profile is a YAML file in `rayfl/devices/profiles/`.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml

from .catalog_algorithms import ALGORITHMS

PLUGINS = "rayfl.algorithms"
"""The entry point group of algorithms defined outside rayfl: `name = module`, the module
registering its algorithm(s) when imported (`rayfl.algorithms.registry`)."""

__all__ = ["ALGORITHMS", "PLUGINS", "DATASETS", "MODELS", "closest", "profile_files", "profiles", "summary"]


DATASETS = {
    "cifar10": "torchvision CIFAR10 (10 classes) from data.data_dir",
    "cifar100": "torchvision CIFAR100 (100 classes) from data.data_dir",
    "digits": "scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes); no download",
    "hf": "a Hugging Face dataset (data.path: hub id or local folder / file; data.features: image or text, label) "
    "through the datasets library",
    "fashion_mnist": "torchvision FashionMNIST (10 classes) from data.data_dir",
    "mnist": "torchvision MNIST (10 classes) from data.data_dir",
    "mnist1d": "MNIST-1D (Greydanus 2020), generated locally with the mnist1d package; 4000/1000, length 40",
    "synthetic": "FedProx's Synthetic(alpha, beta): one logistic model per client, 60-d inputs, each client "
    "generated on demand",
}

MODELS = {
    "alexnet": "AlexNet for 32x32 (MergeSFL): 5 convs + 3 FC, split after layer 5 by default",
    "cnn": "HeteroFL CNN: 4 conv blocks [64,128,256,512]*rate, image input (C,H,W)",
    "cnn1d": "1-D CNN: 3 conv(k5, s2) blocks * rate + linear, sequence input (C,L); split after 2 convs",
    "cnn2": "FedAvg's CNN: 2 conv(5x5) [32,64]*rate + pool, fc 512*rate, image input (C,H,W)",
    "cnn_h": "CNN-H for HAR (MergeSFL): 3 conv(5x5) + 2 FC, split after layer 3",
    "cnn_pfl": "pfl-research's CIFAR-10 CNN: 2 conv(3x3) [32,64]*rate + pool + dropout, fc 128*rate + dropout",
    "cnn_s": "CNN-S for speech (MergeSFL, M5-style): 4 conv1d + 1 FC, split after layer 4",
    "hf_encoder": "Hugging Face encoder (BERT/RoBERTa/MiniLM) cut to its bottom depth layers; numeric tokens as "
    "inputs_embeds; needs transformers",
    "mlp": "MLP: flatten -> [Linear -> Scaler -> norm -> ReLU]* -> Linear, any input",
    "preresnet18": "HeteroFL PreResNet-18: 4 stages x 2 pre-activation blocks [64..512]*rate",
    "preresnet20": "FeDepth PreResNet-20: stem + 9 pre-activation blocks [16x3, 32x3, 64x3]*rate, shared head, skip "
    "links",
    "resstack": "Residual conv stack: stem -> depth x residual blocks (width) -> pool -> linear, sequences or "
    "images; depth- and width-scalable",
    "supernet": "FedSup supernet: MobileNetV1 stages with elastic width, depth and kernel (Table 5), PN",
    "supernet_small": "FedSup supernet for small inputs (digits, MNIST-1D): stride-1 stem, quarter widths",
    "transformer": "Transformer encoder: tokens (rows or patches) -> depth x pre-norm layers (width, heads) -> mean "
    "pool; depth- and width-scalable",
    "vgg16": "VGG-16-BN (MergeSFL, IMAGE-100 at 144x144): 13 convs + 3 FC, split after layer 13",
}


def summary(table: dict[str, str], kind: str, name: str) -> str:
    """`table[name]`; `ValueError` for a name the catalog does not list (a registration it lacks)."""
    if name not in table:
        raise ValueError(f"{kind} {name!r} is not in rayfl/catalog.py; add its one-line summary there")
    return table[name]


def profile_files() -> dict[str, Path]:
    """Built-in device profiles: name -> its YAML file in `rayfl/devices/profiles/`."""
    folder = resources.files("rayfl") / "devices" / "profiles"  # not rayfl.devices: its package imports torch
    return {
        p.name.removesuffix(".yaml"): Path(str(p))
        for p in sorted(folder.iterdir(), key=lambda p: p.name)
        if p.name.endswith(".yaml")
    }


def profiles() -> dict[str, dict[str, Any]]:
    """Built-in device profiles: name -> the raw YAML mapping (validated when a run loads it)."""
    return {name: yaml.safe_load(path.read_text()) for name, path in profile_files().items()}


def closest(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the known name closest to a misspelt one, else ``."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


KNOWN_SHOWN = 160
"""The most characters of known names an error lists; past it, the count left and `rayfl list`."""


def unknown(kind: str, name: str, known: Iterable[str]) -> str:
    """`unknown KIND 'name' (did you mean 'x'?) (known: a, b, ...)`: whole names only, in order,
    as many as fit in `KNOWN_SHOWN` characters, then how many more `rayfl list` shows (a line
    that a printer cuts at its width would cut a name in two)."""
    from .config.base import shown

    names = sorted(known)
    listed: list[str] = []
    while len(listed) < len(names) and len(", ".join([*listed, names[len(listed)]])) <= KNOWN_SHOWN:
        listed.append(names[len(listed)])
    more = f", and {len(names) - len(listed)} more: rayfl list" if len(listed) < len(names) else ""
    return f"unknown {kind} {shown(repr(name), 80)}{closest(name, names)} (known: {', '.join(listed)}{more})"

"""What rayfl offers, by name and one line each, readable without importing torch: the
source of `rayfl list`, of the summaries the registries show, and of the "did you mean"
suggestions for a misspelt name or key.

Every algorithm, dataset and model family registers its implementation under a name listed
here (`registry.register` refuses an unlisted one); `tests/test_catalog.py` checks the two
agree both ways. A built-in device profile is a YAML file in `rayfl/devices/profiles/`.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml

ALGORITHMS = {
    "adasfl": "AdaSFL (MergeSFL's baseline): split FL with batch regulation only",
    "alllarge": "AllLarge: FedAvg at full width on every client (HeteroFL baseline)",
    "alllarge_depth": "AllLarge (InclusiveFL baseline): FedAdam on the largest depth, every client",
    "allsmall": "AllSmall: FedAvg at the smallest level on every client (HeteroFL baseline)",
    "allsmall_depth": "AllSmall (InclusiveFL baseline): FedAdam on the smallest depth, every client",
    "depthfl": "DepthFL (Kim et al. 2023): depth-scaled prefixes by memory budget, self-distillation among exits, FedDyn",
    "ditto": "Ditto (Li et al. 2021): FedAvg plus per-client personal models pulled towards it by lambda",
    "efedsup": "E-FedSup (Kim & Yun 2023): one FLOPs-fitting sub-net per client by tier, only the sub-net travels",
    "exclusivefl": "ExclusiveFL: FedAvg at full width on the clients that fit it (HeteroFL baseline)",
    "exclusivefl_depth": "ExclusiveFL (InclusiveFL baseline): FedAdam on the largest depth, strongest class only",
    "fedadagrad": "FedAdagrad (Reddi et al. 2021): adaptive server optimizer",
    "fedadam": "FedAdam (Reddi et al. 2021): adaptive server optimizer",
    "fedavg": "FedAvg (McMahan et al. 2017): sample-weighted model averaging",
    "fedepth": "FeDepth (Zhang et al. 2023): memory-adaptive depth-wise training of the full model, skip links to the head",
    "fedprox": "FedProx (Li et al. 2020): FedAvg with a proximal term mu",
    "fedsup": "FedSup (Kim & Yun 2023): supernet broadcast, sandwich-sampled sub-nets with in-place distillation per step",
    "fedyogi": "FedYogi (Reddi et al. 2021): adaptive server optimizer",
    "heterofl": "HeteroFL (Diao et al. 2021): nested width sub-models, per-entry aggregation",
    "inclusivefl": "InclusiveFL (Liu et al. 2022): depth groups, layer-wise aggregation, momentum distillation",
    "lgfedavg": "LG-FedAvg (Liang et al. 2020): local bodies, FedAvg over the global top layers",
    "localonly": "Local-only (FedSup Table 2): each client trains its own model, never averaged",
    "mergesfl": "MergeSFL (Liao et al. 2024): split FL with feature merging, batch regulation, GA selection",
    "mfedepth": "m-FeDepth (Zhang et al. 2023): depth-wise training with auxiliary classifiers per block",
    "perfedavg": "Per-FedAvg (Fallah et al. 2020): MAML-style local steps (FO or HF), personalized by one alpha-step",
    "pyramidfl": "PyramidFL-style selection (MergeSFL baseline): oversample by reward, keep the fastest",
    "sfl": "Typical split FL (SplitFed style): bottom models on workers, top on the server",
    "splitmix": "SplitMix (Hong et al. 2022): K thin base networks, each client trains its budget's share, mixed by averaging logits",
}

DATASETS = {
    "cifar10": "torchvision CIFAR10 (10 classes) from data.data_dir",
    "cifar100": "torchvision CIFAR100 (100 classes) from data.data_dir",
    "digits": "scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes); no download",
    "hf": "a Hugging Face dataset (data.path: hub id or local folder / file; data.features: image or text, label) through the datasets library",
    "fashion_mnist": "torchvision FashionMNIST (10 classes) from data.data_dir",
    "mnist": "torchvision MNIST (10 classes) from data.data_dir",
    "mnist1d": "MNIST-1D (Greydanus 2020), generated locally with the mnist1d package; 4000/1000, length 40",
    "synthetic": "FedProx's Synthetic(alpha, beta): one logistic model per client, 60-d inputs, each client generated on demand",
}

MODELS = {
    "alexnet": "AlexNet for 32x32 (MergeSFL): 5 convs + 3 FC, split after layer 5 by default",
    "cnn": "HeteroFL CNN: 4 conv blocks [64,128,256,512]*rate, image input (C,H,W)",
    "cnn1d": "1-D CNN: 3 conv(k5, s2) blocks * rate + linear, sequence input (C,L); split after 2 convs",
    "cnn2": "FedAvg's CNN: 2 conv(5x5) [32,64]*rate + pool, fc 512*rate, image input (C,H,W)",
    "cnn_h": "CNN-H for HAR (MergeSFL): 3 conv(5x5) + 2 FC, split after layer 3",
    "cnn_s": "CNN-S for speech (MergeSFL, M5-style): 4 conv1d + 1 FC, split after layer 4",
    "hf_encoder": "Hugging Face encoder (BERT/RoBERTa/MiniLM) cut to its bottom depth layers; numeric tokens as inputs_embeds; needs transformers",
    "mlp": "MLP: flatten -> [Linear -> Scaler -> norm -> ReLU]* -> Linear, any input",
    "preresnet18": "HeteroFL PreResNet-18: 4 stages x 2 pre-activation blocks [64..512]*rate",
    "preresnet20": "FeDepth PreResNet-20: stem + 9 pre-activation blocks [16x3, 32x3, 64x3]*rate, shared head, skip links",
    "resstack": "Residual conv stack: stem -> depth x residual blocks (width) -> pool -> linear, sequences or images; depth- and width-scalable",
    "supernet": "FedSup supernet: MobileNetV1 stages with elastic width, depth and kernel (Table 5), PN",
    "supernet_small": "FedSup supernet for small inputs (digits, MNIST-1D): stride-1 stem, quarter widths",
    "transformer": "Transformer encoder: tokens (rows or patches) -> depth x pre-norm layers (width, heads) -> mean pool; depth- and width-scalable",
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

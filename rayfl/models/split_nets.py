"""Models of MergeSFL's experiments (Liao et al., Sec. V-A), as `nn.Sequential` with split points.

`split_layer: k` cuts after the k-th weight layer (conv or linear), keeping that layer's
norm, activation and pooling in the bottom and any dropout or flatten before the next weight
layer in the top. Defaults follow the paper and the public code (`models.py`; docs/papers.md,
MergeSFL: public code, split points and models): AlexNet after its 5 convs (features 256x4x4
at 32x32), VGG-16-BN after its 13 convs (512x5x5 at 144x144), CNN-H after its 3 convs, CNN-S
after its 4 1-D convs.
Layouts follow the public code where it has the model; CNN-H and CNN-S follow the paper's text
(three 5x5 convs + two FC; four 1-D convs + one FC) since the code's HAR/M5 networks differ.
"""

from __future__ import annotations

from torch import nn

from .layers import SplitConfig, require_input
from .registry import register


class AlexNetConfig(SplitConfig):
    name: str = "alexnet"
    split_layer: int = 5


@register("alexnet", AlexNetConfig, "AlexNet for 32x32 (MergeSFL): 5 convs + 3 FC, split after layer 5 by default")
def build_alexnet(config: AlexNetConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    require_input("alexnet", input_shape, 3, "image (C, H, W)")
    c, h, w = input_shape
    return nn.Sequential(
        nn.Conv2d(c, 64, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 192, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(192, 384, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, 3, padding=1),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.5),
        nn.Linear(256 * (h // 8) * (w // 8), 4096),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(4096, 4096),
        nn.ReLU(inplace=True),
        nn.Linear(4096, num_classes),
    )


class Vgg16Config(SplitConfig):
    name: str = "vgg16"
    split_layer: int = 13


VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M1", 512, 512, 512, "M")


@register("vgg16", Vgg16Config, "VGG-16-BN (MergeSFL, IMAGE-100 at 144x144): 13 convs + 3 FC, split after layer 13")
def build_vgg16(config: Vgg16Config, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    require_input("vgg16", input_shape, 3, "image (C, H, W)")
    layers: list[nn.Module] = []
    c, h, w = input_shape
    for v in VGG16:
        if v == "M" or v == "M1":  # the public code's 4th pool pads by 1
            pad = 1 if v == "M1" else 0
            layers.append(nn.MaxPool2d(2, padding=pad))
            h, w = (h + 2 * pad) // 2, (w + 2 * pad) // 2
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            c = v
    layers += [
        nn.Flatten(),
        nn.Linear(c * h * w, 4096),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(4096, 4096),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(4096, num_classes),
    ]
    return nn.Sequential(*layers)


class CnnHConfig(SplitConfig):
    name: str = "cnn_h"
    split_layer: int = 3


@register("cnn_h", CnnHConfig, "CNN-H for HAR (MergeSFL): 3 conv(5x5) + 2 FC, split after layer 3")
def build_cnn_h(config: CnnHConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    require_input("cnn_h", input_shape, 3, "image-like (C, H, W)")
    c = input_shape[0]
    return nn.Sequential(
        nn.Conv2d(c, 12, 5, padding=2),
        nn.ReLU(inplace=True),
        nn.Conv2d(12, 32, 5, padding=2),
        nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d((4, 2)),
        nn.Flatten(),
        nn.Linear(64 * 4 * 2, 1024),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.Linear(1024, num_classes),
    )


class CnnSConfig(SplitConfig):
    name: str = "cnn_s"
    split_layer: int = 4


@register("cnn_s", CnnSConfig, "CNN-S for speech (MergeSFL, M5-style): 4 conv1d + 1 FC, split after layer 4")
def build_cnn_s(config: CnnSConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    require_input("cnn_s", input_shape, 2, "sequence (C, L)")
    c = input_shape[0]
    block = lambda i, o, k, s: [nn.Conv1d(i, o, k, s), nn.BatchNorm1d(o), nn.ReLU(inplace=True), nn.MaxPool1d(4)]
    return nn.Sequential(
        *block(c, 32, 80, 16),
        *block(32, 32, 3, 1),
        *block(32, 64, 3, 1),
        nn.Conv1d(64, 64, 3),
        nn.BatchNorm1d(64),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(64, num_classes),
    )

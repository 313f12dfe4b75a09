"""MergeSFL's models and their split points."""

import pytest
import torch
from torch import nn

from rayfl.config import ConfigError
from rayfl.models import build_model
from rayfl.models.cnn1d import Cnn1dConfig
from rayfl.models.cnn2 import Cnn2Config
from rayfl.models.layers import split, split_index
from rayfl.models.split_nets import AlexNetConfig, CnnHConfig, CnnSConfig, Vgg16Config


@pytest.mark.parametrize(
    "cfg, shape, features",
    [
        (AlexNetConfig(), (3, 32, 32), (256, 4, 4)),  # public code: AlexNet bottom output 256x4x4
        (Vgg16Config(), (3, 144, 144), (512, 5, 5)),  # public code: VGG-16-BN bottom output 512x5x5
        (CnnHConfig(), (1, 128, 9), (64, 4, 2)),
        (CnnSConfig(), (1, 16000), (64, 1)),
        (Cnn2Config(), (1, 8, 8), (64, 2, 2)),
        (Cnn1dConfig(), (1, 40), (32, 10)),  # MNIST-1D: length 40 -> 20 -> 10 after two stride-2 convs
    ],
)
def test_split_points_and_feature_shapes(cfg, shape, features):
    model = build_model(cfg, shape, 10).eval()
    bottom, top = split(model, cfg.split_layer)
    x = torch.randn(2, *shape)
    with torch.no_grad():
        f = bottom(x)
        assert tuple(f.shape[1:]) == features
        torch.testing.assert_close(top(f), model(x))
    convs = [m for m in bottom if isinstance(m, (nn.Conv1d, nn.Conv2d))]
    assert len(convs) == cfg.split_layer and not any(isinstance(m, (nn.Dropout, nn.Flatten)) for m in bottom)


def test_alexnet_is_the_papers_136_mb_model():
    params = sum(p.numel() for p in build_model(AlexNetConfig(), (3, 32, 32), 10).parameters())
    assert abs(params * 4 / 2**20 - 136) / 136 < 0.02  # "an 8-layer AlexNet with size of 136MB"


def test_split_layer_out_of_range_names_the_key():
    model = build_model(Cnn2Config(), (1, 8, 8), 10)
    assert split_index(model, 1) == 3  # conv, relu, pool | conv ...
    with pytest.raises(ConfigError, match="model.split_layer: 4 is outside 1..3"):
        split(model, 4)

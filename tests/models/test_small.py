"""MLP and 1-D CNN shapes and widths."""

import pytest
import torch
from torch import nn

from rayfl.config import ConfigError
from rayfl.models import build_model
from rayfl.models.cnn import CnnConfig
from rayfl.models.cnn1d import Cnn1dConfig
from rayfl.models.mlp import MlpConfig


def test_mlp_width_rate():
    model = build_model(MlpConfig(hidden=(200, 100), rate=0.5), (60,), 10)
    assert [m.out_features for m in model.modules() if isinstance(m, nn.Linear)] == [100, 50, 10]
    assert model(torch.randn(4, 60)).shape == (4, 10)


def test_cnn1d_on_mnist1d_shape():
    model = build_model(Cnn1dConfig(rate=0.5), (1, 40), 10)
    # lengths 40 -> 20 -> 10 -> 5 with 16 channels
    assert model[-1].in_features == 16 * 5
    assert model(torch.randn(4, 1, 40)).shape == (4, 10)


def test_shape_mismatch_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model.name: cnn needs image \(C, H, W\) input"):
        build_model(CnnConfig(), (60,), 10)
    with pytest.raises(ConfigError, match=r"model.name: cnn1d needs sequence \(C, L\) input"):
        build_model(Cnn1dConfig(), (1, 8, 8), 10)


def test_cnn2_is_fedavgs_cnn():
    from rayfl.models.cnn2 import Cnn2Config

    model = build_model(Cnn2Config(), (1, 28, 28), 10)
    # McMahan et al.: 1,663,370 parameters on MNIST (5x5 convs 32 and 64, fc 512):
    # (25*32 + 32) + (25*32*64 + 64) + (7*7*64*512 + 512) + (512*10 + 10)
    assert sum(p.numel() for p in model.parameters()) == 832 + 51264 + 1606144 + 5130 == 1_663_370
    assert build_model(Cnn2Config(), (1, 8, 8), 10)(torch.randn(2, 1, 8, 8)).shape == (2, 10)

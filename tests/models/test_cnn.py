"""HeteroFL CNN: FLOPs and parameters against hand counts, norms, Scaler."""

import pytest
import torch
from torch import nn

from rayfl.devices import measure
from rayfl.models import build_model
from rayfl.models.cnn import CnnConfig
from rayfl.models.layers import Scaler

HIDDEN = [64, 128, 256, 512]


def hand_counts(rate: float, size: int = 28, classes: int = 10):
    """Per-layer forward FLOPs (2 per multiply-add, no bias) and parameters of the CNN on 1 x size x size."""
    widths = [int(-(-w * rate // 1)) for w in HIDDEN]
    convs, params, c_in, s = [], 0, 1, size
    for i, w in enumerate(widths):
        convs.append(2 * w * c_in * 9 * s * s)
        params += w * c_in * 9 + w + 2 * w  # conv weight + bias, BN gamma + beta
        c_in = w
        if i < 3:
            s //= 2
    linear = 2 * c_in * classes
    params += c_in * classes + classes
    return convs, linear, params


@pytest.mark.parametrize("rate, table_params", [(1.0, 1.6e6), (1 / 16, 7e3)])
def test_flops_and_params_match_hand_counts(rate, table_params):
    convs, linear, params = hand_counts(rate)
    # rate 1: 903,168 + 28,901,376 + 28,901,376 + 21,233,664 + 10,240 = 79,949,824 FLOPs
    if rate == 1.0:
        assert sum(convs) + linear == 79_949_824
    cost = measure(build_model(CnnConfig(rate=rate), (1, 28, 28), 10), (1, 28, 28))
    assert cost.forward_flops == sum(convs) + linear
    # Backward costs two forwards (grad input + grad weight), except no input gradient for the first conv.
    assert cost.train_flops == 3 * (sum(convs) + linear) - convs[0]
    assert cost.num_params == params
    # HeteroFL Table 1 (MNIST CNN): 1.6 M / 80.5 M FLOPs at a, 7 K / 400 K at e; within 10%.
    assert abs(cost.num_params - table_params) / table_params < 0.1
    assert abs(cost.forward_flops - (80.5e6 if rate == 1 else 400e3)) / (80.5e6 if rate == 1 else 400e3) < 0.1


@pytest.mark.parametrize(
    "norm, cls",
    [
        ("bn", nn.BatchNorm2d),
        ("sbn", nn.BatchNorm2d),
        ("gn", nn.GroupNorm),
        ("in", nn.GroupNorm),
        ("ln", nn.GroupNorm),
        ("none", None),
    ],
)
def test_norm_options(norm, cls):
    model = build_model(CnnConfig(norm=norm, rate=0.25), (1, 8, 8), 10)
    norms = [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))]
    if cls is None:
        assert norms == []
        return
    assert len(norms) == 4 and all(isinstance(m, cls) for m in norms)
    if norm == "sbn":
        assert all(m.running_mean is None and not m.track_running_stats for m in norms)
        assert not any("running" in k for k in model.state_dict())
    if norm == "in":
        assert [m.num_groups for m in norms] == [16, 32, 64, 128]
    if norm == "ln":
        assert all(m.num_groups == 1 for m in norms)
    assert model(torch.randn(3, 1, 8, 8)).shape == (3, 10)


def test_scaler_divides_by_rate_in_training_only():
    s = Scaler(0.25)
    x = torch.ones(2, 3)
    assert torch.equal(s.train()(x), torch.full((2, 3), 4.0))
    assert torch.equal(s.eval()(x), x)


def test_widths_follow_ceil_of_rate():
    model = build_model(CnnConfig(rate=0.3), (3, 32, 32), 100)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [20, 39, 77, 154]  # ceil(0.3 * [64, 128, 256, 512])
    assert model[-1].out_features == 100

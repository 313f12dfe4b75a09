"""FLOPs per sample on hand formulas, layer kind by layer kind: 2 per multiply-add of a matmul or a
convolution; a convolution's (or a linear layer's) training step adds the input's gradient (when
the input takes one) and the weight's gradient, each as many multiply-adds as the forward."""

import pytest
import torch
from torch import nn

from rayfl.devices.cost import flops_on


def conv_forward(c_in: int, c_out: int, k: int, out_positions: int, groups: int) -> int:
    """Each output element: k^2 (or k) taps over the c_in / groups channels of its group."""
    return 2 * out_positions * c_out * (c_in // groups) * k


@pytest.mark.parametrize(
    "name, layer, shape, forward",
    [
        # 5x5 input, 3x3 kernel, padding 1: 25 output positions, 9 taps each
        ("dense conv", nn.Conv2d(8, 6, 3, padding=1), (8, 5, 5), conv_forward(8, 6, 9, 25, 1)),
        ("grouped conv", nn.Conv2d(8, 6, 3, padding=1, groups=2), (8, 5, 5), conv_forward(8, 6, 9, 25, 2)),
        ("depthwise conv", nn.Conv2d(8, 8, 3, padding=1, groups=8), (8, 5, 5), conv_forward(8, 8, 9, 25, 8)),
        # a strided depthwise 1-d convolution: 10 positions, stride 2, kernel 5, padding 2: 5 outputs
        ("depthwise conv1d", nn.Conv1d(4, 4, 5, stride=2, padding=2, groups=4), (4, 10), conv_forward(4, 4, 5, 5, 4)),
        ("linear", nn.Linear(7, 3), (7,), 2 * 7 * 3),
        ("batch norm", nn.BatchNorm2d(8), (8, 5, 5), 0),
    ],
)
def test_flops_of_each_layer_kind_equal_the_hand_formula(name, layer, shape, forward):
    x = torch.randn(2, *shape)
    assert flops_on(layer, x, train=False) == forward
    # the data takes no gradient: forward + the weight's gradient
    assert flops_on(layer, x, train=True) == 2 * forward
    # inside a network the input takes one too: forward + the input's + the weight's
    assert flops_on(layer, x.clone().requires_grad_(), train=True) == 3 * forward


def test_a_depthwise_separable_block_trains_at_three_times_its_forward():
    """The case torch's counter got wrong (its weight gradient counted as a dense convolution:
    about 22x the forward for FedSup's biggest child)."""
    block = nn.Sequential(
        nn.Conv2d(64, 64, 3, padding=1, groups=64), nn.BatchNorm2d(64), nn.ReLU(), nn.Conv2d(64, 32, 1)
    )
    x = torch.randn(2, 64, 4, 4, requires_grad=True)
    forward = conv_forward(64, 64, 9, 16, 64) + conv_forward(64, 32, 1, 16, 1)
    assert flops_on(block, x, train=False) == forward
    assert flops_on(block, x, train=True) == 3 * forward

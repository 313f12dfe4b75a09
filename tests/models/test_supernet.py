"""FedSup's supernet: parametric normalization against Eq. 4-5 on hand numbers, and sub-net
extraction (first channels, first blocks, centre-cropped kernels) against hand-built tensors."""

import numpy as np
import pytest
import torch

from rayfl.algorithms.aggregate import extract
from rayfl.models import build_model
from rayfl.models.supernet import (
    DynamicConv,
    ParametricNorm,
    Subnet,
    SupernetSmallConfig,
    all_subnets,
    crop,
    largest,
    medium,
    smallest,
)

SMALL = SupernetSmallConfig()


def test_parametric_normalization_on_hand_numbers():
    pn = ParametricNorm(3)
    with torch.no_grad():
        pn.alpha[:] = torch.tensor([1.0, 0.0, 9.0])
        pn.weight[:] = torch.tensor([2.0, 1.0, 9.0])
        pn.bias[:] = torch.tensor([0.5, 0.0, 9.0])
    # Two samples, two channels (the first two of three: slicing), two positions.
    x = torch.tensor([[[1.0, 3.0], [0.0, 4.0]], [[-1.0, 1.0], [0.0, 0.0]]])
    y = pn(x)
    # Channel 0: x - alpha = 0, 2, -2, 0; RMS = sqrt((0 + 4 + 4 + 0) / 4) = sqrt(2).
    r0 = np.sqrt(2.0)
    assert y[:, 0].flatten().tolist() == pytest.approx([0.5, 2 * 2 / r0 + 0.5, 2 * -2 / r0 + 0.5, 0.5], rel=1e-6)
    # Channel 1: 0, 4, 0, 0; RMS = sqrt(16 / 4) = 2.
    assert y[:, 1].flatten().tolist() == pytest.approx([0.0, 2.0, 0.0, 0.0], rel=1e-6)
    # No running statistics: evaluation normalises the same way.
    assert not list(pn.buffers()) and torch.equal(pn.eval()(x), y)


def test_crop_takes_first_channels_and_centre_kernels():
    full = np.arange(4 * 1 * 7 * 7).reshape(4, 1, 7, 7)
    s = crop((2, 1, 3, 3), full.shape)
    assert full[s].tolist() == full[:2, :, 2:5, 2:5].tolist()
    with pytest.raises(ValueError):
        crop((2, 1, 4, 4), full.shape)  # an even crop of an odd kernel has no centre


def test_a_subnet_is_the_crop_of_the_supernet():
    torch.manual_seed(0)
    net = build_model(SMALL, (1, 8, 8), 10)
    sub = Subnet(widths=(8, 16, 32, 128), depths=(1, 1, 2, 1), kernels=(3, 5, 7, 3))
    static = build_model(sub.config(SMALL), (1, 8, 8), 10)
    assert Subnet.of(sub.config(SMALL)) == sub  # the static config names its sub-net back
    full = net.state_dict()
    cropped = extract(
        {k: v.numpy() for k, v in full.items()}, {k: v.shape for k, v in static.state_dict().items()}, where=crop
    )
    static.load_state_dict({k: torch.from_numpy(v) for k, v in cropped.items()})
    # Hand-built checks of what the crop must be.
    s = static.state_dict()
    assert s["stages.1.0.dw.weight"].shape == (8, 1, 5, 5)  # stage 2's input: stage 1's 8 channels
    assert torch.equal(s["stages.1.0.dw.weight"], full["stages.1.0.dw.weight"][:8, :, 1:6, 1:6])
    assert torch.equal(s["stages.3.0.pw.weight"], full["stages.3.0.pw.weight"][:128, :32])
    assert "stages.3.1.dw.weight" not in s and "stages.2.1.dw.weight" in s  # the first blocks of each stage
    assert torch.equal(s["linear.weight"], full["linear.weight"][:, :128])
    x = torch.randn(4, 1, 8, 8)
    net.set_active(sub)
    net.eval(), static.eval()
    torch.testing.assert_close(net(x), static(x))


def test_subnet_space_and_its_named_children():
    assert len(all_subnets(SMALL)) == (2 * 1 * 3) * (2 * 2 * 3) ** 3
    assert largest(SMALL) == Subnet((16, 32, 64, 256), (1, 2, 2, 2), (7, 7, 7, 7))
    assert smallest(SMALL) == Subnet((8, 16, 32, 128), (1, 1, 1, 1), (3, 3, 3, 3))
    assert medium(SMALL) == Subnet((16, 32, 64, 256), (1, 1, 1, 1), (5, 5, 5, 5))


def test_the_codes_frozen_last_stage_is_an_option():
    frozen = SMALL.model_copy(update={"elastic_last": False})
    assert smallest(frozen) == Subnet((8, 16, 32, 256), (1, 1, 1, 1), (3, 3, 3, 7))
    g = np.random.default_rng(0)
    from rayfl.models.supernet import random_subnet

    draws = [random_subnet(frozen, g) for _ in range(20)]
    assert all(d.widths[-1] == 256 and d.kernels[-1] == 7 for d in draws) and len({d.depths[-1] for d in draws}) == 2


def test_sequences_and_the_cifar_supernet_build():
    y = build_model(SMALL, (1, 40), 10)(torch.randn(2, 1, 40))
    assert y.shape == (2, 10)
    from rayfl.models.supernet import SupernetConfig

    big = build_model(SupernetConfig(), (3, 32, 32), 10)
    assert big(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_depthwise_kernels_start_at_torchs_default_and_full_kernels_at_kaiming_fan_out():
    """A 7x7 depthwise kernel: uniform on +-1/sqrt(fan_in) = +-1/7 (torch's default, a = sqrt(5)),
    std 1/(7 sqrt(3)) = 0.082; Kaiming fan-out would give sqrt(2 / (256 * 49)) = 0.013. A 1x1
    pointwise kernel 256 -> 512: normal, std sqrt(2 / 512) = 0.0625."""
    torch.manual_seed(0)
    depthwise = DynamicConv(2, 256, 256, 7, depthwise=True).weight
    assert depthwise.abs().max() <= 1 / 7
    assert float(depthwise.std()) == pytest.approx(1 / (7 * 3**0.5), rel=0.02)
    pointwise = DynamicConv(2, 256, 512, 1).weight
    assert float(pointwise.std()) == pytest.approx((2 / 512) ** 0.5, rel=0.02)

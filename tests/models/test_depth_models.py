"""Depth-scalable families: a model of depth L is the first L layers of a deeper one, named so."""

import pytest
import torch

from rayfl.models import build_model
from rayfl.models.layers import is_head, layer_of
from rayfl.models.resstack import ResStackConfig
from rayfl.models.transformer import TransformerConfig


def test_transformer_parameters_match_a_hand_count():
    # digits (1, 8, 8): 8 row tokens of 8 values; width 4, one head of width 4, ffn 4, 10 classes
    model = build_model(TransformerConfig(width=4, heads=1, ffn=4, depth=1), (1, 8, 8), 10)
    embed = 8 * 4 + 4 + 8 * 4  # linear embedding and position embedding
    layer = 2 * 4 + 3 * (4 * 4 + 4) + (4 * 4 + 4) + 2 * 4 + 2 * (4 * 4 + 4)  # norm1, q/k/v, out, norm2, ff1, ff2
    head = 2 * 4 + 4 * 10 + 10
    assert sum(p.numel() for p in model.parameters()) == embed + layer + head == 262


@pytest.mark.parametrize(
    "config, shape",
    [
        (TransformerConfig(width=8, heads=2, ffn=8, depth=5), (1, 40)),
        (ResStackConfig(width=4, depth=5), (1, 40)),
        (ResStackConfig(width=4, depth=5), (1, 8, 8)),
    ],
)
def test_a_shallow_model_is_the_bottom_of_a_deep_one(config, shape):
    torch.manual_seed(0)
    deep = build_model(config, shape, 10).eval()
    shallow = build_model(config.model_copy(update={"depth": 2}), shape, 10).eval()
    deep_state, shallow_state = deep.state_dict(), shallow.state_dict()
    layers = {layer_of(k, config.layer_prefix) for k in deep_state} - {None}
    assert {i for i, _ in layers} == set(range(5))
    # the shallow model's keys are the deep one's stem, layers 0 and 1, and head, with equal shapes
    expected = {k for k in deep_state if (layer_of(k, config.layer_prefix) or (0, ""))[0] < 2}
    assert set(shallow_state) == expected
    assert all(shallow_state[k].shape == deep_state[k].shape for k in expected)
    assert any(is_head(k) for k in expected) and not any(
        is_head(k) for k in expected if layer_of(k, config.layer_prefix)
    )
    # loaded with the deep model's tensors it computes the deep model cut after two layers
    shallow.load_state_dict({k: deep_state[k] for k in expected})
    x = torch.randn(3, *shape)
    del deep.layers[2:]
    torch.testing.assert_close(shallow(x), deep(x))


def test_width_rate_takes_leading_blocks_of_every_tensor():
    full = build_model(TransformerConfig(width=8, heads=2, ffn=8, depth=2), (1, 8, 8), 10).state_dict()
    half = build_model(TransformerConfig(width=8, heads=2, ffn=8, depth=2, rate=0.5), (1, 8, 8), 10).state_dict()
    assert set(half) == set(full)
    # heads stay 2, each head's width halves: q is (heads, head width, width)
    assert half["layers.0.attn.q"].shape == (2, 2, 4) and full["layers.0.attn.q"].shape == (2, 4, 8)
    assert all(all(h <= f for h, f in zip(half[k].shape, full[k].shape)) for k in full)
    assert half["head.fc.weight"].shape == (10, 4)

"""A transformer encoder stack for small sequence and image inputs, depth- and width-scalable.

Input to tokens: a sequence (C, L) is cut into L / `patch` tokens of C x `patch` values (MNIST-1D:
10 tokens of 4); an image (C, H, W) gives one token per row (digits: 8 tokens of 8). A linear
embedding to `width` plus a learned position embedding form the stem; `depth` pre-norm encoder
layers (multi-head self-attention, then a GELU feed-forward block, each added to the residual
stream after a LayerNorm) follow; the head is a LayerNorm, the mean over tokens and a linear
classifier. Trained from scratch, or from pretrained weights (`init_weights`: FeDepth's depth-wise
fine-tuning, where `enter` and `exit` are its stem and skip to the head).

Depth (InclusiveFL): layers are `layers.<i>.` with one shape, so a model of depth L is the first
L layers of a deeper one. Width (HeteroFL): `rate` scales the model width, the per-head width
and the feed-forward width, with the number of heads fixed; the attention projections are
stored per head, (heads, head width, model width), so taking every tensor's leading block (the
HeteroFL sub-model) takes the first dimensions of every head, as HeteroFL's transformer does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..config import ConfigError
from .layers import DepthConfig, ScaledConfig, Scaler, scaled
from .registry import register


class TransformerConfig(ScaledConfig, DepthConfig):
    name: str = "transformer"
    width: int = Field(64, ge=1, description="model width d at rate 1")
    heads: int = Field(4, ge=1, description="attention heads (fixed under width scaling)")
    ffn: int = Field(128, ge=1, description="feed-forward width at rate 1")
    patch: int = Field(4, ge=1, description="values per token of a 1-D sequence")
    norm: str = Field("ln", pattern="^ln$", description="LayerNorm (the only norm of this family)")


class Attention(nn.Module):
    """Multi-head self-attention with per-head projections (heads, head width, model width)."""

    def __init__(self, width: int, heads: int, head_width: int):
        super().__init__()
        self.q = nn.Parameter(torch.empty(heads, head_width, width))
        self.k = nn.Parameter(torch.empty(heads, head_width, width))
        self.v = nn.Parameter(torch.empty(heads, head_width, width))
        self.q_bias = nn.Parameter(torch.zeros(heads, head_width))
        self.k_bias = nn.Parameter(torch.zeros(heads, head_width))
        self.v_bias = nn.Parameter(torch.zeros(heads, head_width))
        self.out = nn.Parameter(torch.empty(width, heads, head_width))
        self.out_bias = nn.Parameter(torch.zeros(width))
        for w in (self.q, self.k, self.v):
            nn.init.normal_(w, std=width**-0.5)
        nn.init.normal_(self.out, std=(heads * head_width) ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, d)
        q = torch.einsum("btd,hed->bhte", x, self.q) + self.q_bias[:, None]
        k = torch.einsum("btd,hed->bhte", x, self.k) + self.k_bias[:, None]
        v = torch.einsum("btd,hed->bhte", x, self.v) + self.v_bias[:, None]
        # softmax(q k^T / sqrt(e)) v written out: vmap (ray.vectorize) has a batching rule for each
        # step, not for the fused CPU kernel of F.scaled_dot_product_attention
        att = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1) @ v  # (B, H, T, e)
        return torch.einsum("bhte,dhe->btd", att, self.out) + self.out_bias


class EncoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, head_width: int, ffn: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, head_width)
        self.norm2 = nn.LayerNorm(width)
        self.ff1 = nn.Linear(width, ffn)
        self.ff2 = nn.Linear(ffn, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ff2(F.gelu(self.ff1(self.norm2(x))))


class Head(nn.Module):
    def __init__(self, width: int, num_classes: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x).mean(1))


class Transformer(nn.Module):
    def __init__(self, config: TransformerConfig, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        self.tokens, token_width = tokenization(input_shape, config.patch)
        width = scaled(config.width, config.rate)
        head_width = scaled(config.width // config.heads, config.rate)
        self.embed = nn.Linear(token_width, width)
        self.position = nn.Parameter(torch.randn(self.tokens, width) * 0.02)
        self.scaler = Scaler(config.scaler)
        self.layers = nn.ModuleList(
            EncoderLayer(width, config.heads, head_width, scaled(config.ffn, config.rate)) for _ in range(config.depth)
        )
        self.head = Head(width, num_classes)

    def enter(self, x: torch.Tensor, skip: int = 0) -> torch.Tensor:
        """The stem's tokens, the input of any layer (every layer keeps their shape: FeDepth's
        skip of the first layers and its links are identities here)."""
        return self.scaler(self.embed(x.reshape(len(x), self.tokens, -1)) + self.position)

    def exit(self, z: torch.Tensor, i: int, aux: bool = False) -> torch.Tensor:
        """Logits from layer i's output: the shared head, since every layer's output has its input's shape."""
        return self.head(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.enter(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def tokenization(input_shape: tuple[int, ...], patch: int) -> tuple[int, int]:
    """(tokens, values per token): an image's rows, or a sequence cut into `patch`-long pieces."""
    if len(input_shape) == 3:
        c, h, w = input_shape
        return h, c * w
    if len(input_shape) == 2:
        c, length = input_shape
        if length % patch:
            raise ConfigError(f"model.patch: {patch} does not divide the sequence length {length}")
        return length // patch, c * patch
    if len(input_shape) == 1:
        if input_shape[0] % patch:
            raise ConfigError(f"model.patch: {patch} does not divide the input length {input_shape[0]}")
        return input_shape[0] // patch, patch
    raise ConfigError(f"model.name: transformer needs a sequence or an image, the dataset gives {input_shape}")


@register(
    "transformer",
    TransformerConfig,
    "Transformer encoder: tokens (rows or patches) -> depth x pre-norm layers (width, heads) -> mean pool; depth- "
    "and width-scalable",
)
def build_transformer(config: TransformerConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if config.width % config.heads:
        raise ConfigError(f"model.heads: {config.heads} does not divide model.width {config.width}")
    return Transformer(config, input_shape, num_classes)

"""A Hugging Face encoder (BERT, RoBERTa, MiniLM, ...) cut to its bottom `depth` layers.

InclusiveFL (Liu et al. 2022) fine-tunes RoBERTa with 4, 8 and 12 of its layers: a model of
depth L keeps the pretrained embeddings and first L encoder layers. `model.pretrained` names the
checkpoint (a local directory, or a hub name where a network exists); `model.hf_config` builds an
encoder from scratch instead (`model_type` and sizes), which is what runs offline. Needs the
optional `transformers` package (`pip install -e ".[hf]"`).

rayfl's datasets are numeric, so inputs are tokenized like `transformer` (image rows, or 1-D
patches) and enter through a linear map to the encoder width as `inputs_embeds`; the encoder's
own position and type embeddings and LayerNorm follow. The word embeddings are dropped (no token
ids reach them). Layers are exposed as `layers.<i>.` (the encoder's layer list), the head is a
LayerNorm, the mean over tokens and a linear classifier (`head.`), so the depth methods slice
it like any `DepthConfig` family.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from pydantic import Field, field_serializer, field_validator
from torch import nn

from ..config import ConfigError
from .layers import DepthConfig
from .registry import register
from .transformer import Head, tokenization

TINY_BERT = (("hidden_size", 64), ("intermediate_size", 128), ("model_type", "bert"), ("num_attention_heads", 4))

Setting = tuple[str, str | int | float | bool]


class HFEncoderConfig(DepthConfig):
    name: str = "hf_encoder"
    pretrained: str | None = Field(
        None, description="a checkpoint directory or hub name (e.g. roberta-base); its first `depth` layers are loaded"
    )
    hf_config: tuple[Setting, ...] = Field(
        TINY_BERT, description="without `pretrained`: the encoder built from scratch, a mapping (model_type and sizes)"
    )
    patch: int = Field(4, ge=1, description="values per token of a 1-D sequence")

    @field_validator("hf_config", mode="before")
    @classmethod
    def _settings(cls, v: Any) -> Any:
        """A mapping is kept as sorted (key, value) pairs, so the config stays hashable."""
        return tuple(sorted(v.items())) if isinstance(v, Mapping) else v

    @field_serializer("hf_config")
    def _mapping(self, v: tuple[Setting, ...]) -> dict[str, Any]:
        return dict(v)


def load_encoder(config: HFEncoderConfig) -> nn.Module:
    """The Hugging Face base model with `depth` layers and no pooler."""
    try:
        from transformers import AutoConfig, AutoModel
    except ImportError as exc:
        raise ConfigError('model.name: hf_encoder needs the transformers package (pip install -e ".[hf]")') from exc
    if config.pretrained:
        try:
            return AutoModel.from_pretrained(config.pretrained, num_hidden_layers=config.depth, add_pooling_layer=False)
        except OSError as exc:
            raise ConfigError(
                f"model.pretrained: cannot load {config.pretrained!r} ({str(exc).splitlines()[0]})"
            ) from exc
    settings = {**dict(config.hf_config), "num_hidden_layers": config.depth}
    if "model_type" not in settings:
        raise ConfigError("model.hf_config: name the architecture with model_type (bert, roberta, ...)")
    try:
        hf_config = AutoConfig.for_model(**settings)
    except ValueError as exc:
        raise ConfigError(f"model.hf_config: {str(exc).splitlines()[0]}") from exc
    return AutoModel.from_config(hf_config, add_pooling_layer=False)


class HFEncoder(nn.Module):
    def __init__(self, config: HFEncoderConfig, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        encoder = load_encoder(config)
        width = encoder.config.hidden_size
        self.tokens, token_width = tokenization(input_shape, config.patch)
        self.embed = nn.Linear(token_width, width)
        self.embeddings = encoder.embeddings
        self.embeddings.word_embeddings = None  # numeric tokens enter as inputs_embeds
        self.layers = encoder.encoder.layer
        self.head = Head(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embeddings(inputs_embeds=self.embed(x.reshape(len(x), self.tokens, -1)))
        for layer in self.layers:
            out = layer(h)
            h = out[0] if isinstance(out, tuple) else out  # transformers 4 returns a tuple
        return self.head(h)


@register(
    "hf_encoder",
    HFEncoderConfig,
    "Hugging Face encoder (BERT/RoBERTa/MiniLM) cut to its bottom depth layers; numeric tokens as inputs_embeds; "
    "needs transformers",
)
def build_hf_encoder(config: HFEncoderConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return HFEncoder(config, input_shape, num_classes)

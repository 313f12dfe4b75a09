"""The Hugging Face encoder family, offline: a tiny BERT built from a config, cut by depth, and
the real loading path (`from_pretrained` of a local checkpoint keeps its first `depth` layers)."""

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.config import ConfigError
from rayfl.load import load_config
from rayfl.models import build_model
from rayfl.models.hf_encoder import HFEncoderConfig
from rayfl.runner import run_local

TINY = {"model_type": "bert", "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 8}


def test_depths_slice_one_encoder():
    deep = build_model(HFEncoderConfig(depth=3, hf_config=TINY), (1, 8, 8), 10).state_dict()
    shallow = build_model(HFEncoderConfig(depth=2, hf_config=TINY), (1, 8, 8), 10).state_dict()
    assert {k: v.shape for k, v in shallow.items()} == {k: deep[k].shape for k in shallow}
    assert sorted({k.split(".")[1] for k in deep if k.startswith("layers.")}) == ["0", "1", "2"]
    assert not any("word_embeddings" in k for k in deep)  # numeric tokens never reach them
    logits = build_model(HFEncoderConfig(depth=2, hf_config=TINY), (1, 40), 10)(torch.randn(3, 1, 40))
    assert logits.shape == (3, 10)


def test_a_local_checkpoint_gives_its_bottom_layers(tmp_path):
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    full = AutoModel.from_config(AutoConfig.for_model(**TINY, num_hidden_layers=3), add_pooling_layer=False)
    full.save_pretrained(tmp_path / "ckpt")
    cut = build_model(HFEncoderConfig(depth=2, pretrained=str(tmp_path / "ckpt")), (1, 8, 8), 10).state_dict()
    saved = full.state_dict()
    for i in range(2):
        for name in ("attention.self.query.weight", "output.dense.bias"):
            torch.testing.assert_close(cut[f"layers.{i}.{name}"], saved[f"encoder.layer.{i}.{name}"])
    torch.testing.assert_close(
        cut["embeddings.position_embeddings.weight"], saved["embeddings.position_embeddings.weight"]
    )
    with pytest.raises(ConfigError, match="model.pretrained: cannot load"):
        build_model(HFEncoderConfig(depth=2, pretrained=str(tmp_path / "missing")), (1, 8, 8), 10)


def test_inclusivefl_trains_depth_groups_of_the_encoder(tmp_path):
    hf = "{" + ", ".join(f"{k}: {v}" for k, v in TINY.items()) + "}"
    cfg = load_config(
        None,
        [
            "algorithm.name=inclusivefl",
            "model.name=hf_encoder",
            f"model.hf_config={hf}",
            "model.depth=3",
            "algorithm.depths=1-2-3",
            "federation.rounds=2",
        ],
    )
    summary = run_local(cfg, tmp_path)
    assert [g["depth"] for g in summary["groups"].values()] == [1, 2, 3]
    metrics = pd.read_parquet(tmp_path / "metrics.parquet")
    assert (
        np.isfinite(metrics["test_loss"]).all()
        and (pd.read_parquet(tmp_path / "clients.parquet")["status"] == "ok").all()
    )
    assert load_config(tmp_path / "config.yaml").model == cfg.model  # the mapping survives config.yaml

"""Checkpoints: plain-data round trip, and a resumed run equal to one that never stopped."""

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl import checkpoint
from rayfl.algorithms import server_opt
from rayfl.algorithms.base import ServerState
from rayfl.config import ConfigError, load_config
from rayfl.runner import run_local


def test_round_trip_keeps_weights_optimizer_and_client_state(tmp_path):
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(7)}
    opt = server_opt.init("adam", {"w": weights["w"]}, eta=0.1)
    opt, _ = server_opt.apply(opt, {"w": weights["w"]}, {"w": np.ones((2, 3))})
    state = ServerState(round=4, weights=weights, opt_state=opt, clients={3: {"head": np.ones(2, np.float32)}})
    path = checkpoint.save(tmp_path, state, virtual_time_s=12.5)
    assert path.name == "round_00004.pt"
    torch.load(path, weights_only=True)  # plain data: loads without unpickling code
    back, vt = checkpoint.latest(tmp_path)
    assert vt == 12.5 and back.round == 4
    assert all(np.array_equal(back.weights[k], weights[k]) for k in weights)
    assert back.opt_state.kind == "adam" and back.opt_state.t == 1
    assert np.array_equal(back.opt_state.m["w"], opt.m["w"]) and np.array_equal(back.opt_state.v["w"], opt.v["w"])
    assert np.array_equal(back.clients[3]["head"], np.ones(2))


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint under"):
        checkpoint.latest(tmp_path)


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    base = ["model.name=mlp", "algorithm.name=fedadam", "federation.checkpoint_every=2"]
    run_local(load_config(None, [*base, "federation.rounds=4"]), tmp_path / "straight")
    # A run that "crashed" after round 3, whose last checkpoint is round 2.
    broken = tmp_path / "broken"
    run_local(load_config(None, [*base, "federation.rounds=3"]), broken)
    (broken / "checkpoints" / "round_00003.pt").unlink()
    run_local(load_config(broken / "config.yaml", ["federation.rounds=4"]), broken, resume=True)
    for name in ("metrics.parquet", "clients.parquet"):
        a, b = (pd.read_parquet(d / name) for d in (tmp_path / "straight", broken))
        cols = [c for c in a.columns if c != "wall_time_s"]
        pd.testing.assert_frame_equal(a[cols], b[cols])
    assert sorted(p.name for p in (broken / "checkpoints").iterdir()) == ["round_00002.pt", "round_00004.pt"]

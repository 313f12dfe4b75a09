"""Checkpoints: plain-data round trip, and a resumed run equal to one that never stopped."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl import checkpoint
from rayfl.algorithms import server_opt
from rayfl.algorithms.messages import ServerState
from rayfl.config import ConfigError
from rayfl.load import load_config
from rayfl.runner import run_local
from rayfl.statetypes import state_type


def test_round_trip_keeps_weights_optimizer_and_client_state(tmp_path):
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(7)}
    opt = server_opt.init("adam", {"w": weights["w"]}, eta=0.1)
    opt, _ = server_opt.apply(opt, {"w": weights["w"]}, {"w": np.ones((2, 3))})
    state = ServerState(round=4, weights=weights, opt_state=opt, clients={3: {"head": np.ones(2, np.float32)}})
    path = checkpoint.save(tmp_path, state, virtual_time_s=12.5)
    assert path.name == "round_00004.pt"
    torch.load(path, weights_only=True)  # plain data: loads without unpickling code
    saved = checkpoint.latest(tmp_path)
    back, vt = saved.state, saved.virtual_time_s
    assert vt == 12.5 and back.round == 4
    assert all(np.array_equal(back.weights[k], weights[k]) for k in weights)
    assert back.opt_state.kind == "adam" and back.opt_state.t == 1
    assert np.array_equal(back.opt_state.m["w"], opt.m["w"]) and np.array_equal(back.opt_state.v["w"], opt.v["w"])
    assert np.array_equal(back.clients[3]["head"], np.ones(2))


@state_type
@dataclasses.dataclass(frozen=True)
class Groups:
    """A policy's own nested server state: one Adam optimizer per device group, and a tag."""

    adam: tuple[server_opt.ServerOptState, ...]
    tag: str


def test_a_nested_server_state_round_trips_exactly(tmp_path):
    g = np.random.default_rng(0)
    groups = []
    for k, shape in enumerate([(2, 3), (4,), (1, 1, 2)]):  # three groups' Adam moments and step counts
        params = {"w": g.standard_normal(shape).astype(np.float32)}
        opt = server_opt.init("adam", params, eta=0.1 * (k + 1))
        for _ in range(k + 1):
            opt, params = server_opt.apply(opt, params, {"w": g.standard_normal(shape)})
        groups.append(opt)
    clients = {c: {"reward": float(g.random()), "seen": [c, "x", None], "k": np.int64(c)} for c in (0, 5, 17)}
    state = ServerState(
        round=7, weights={"w": np.ones(3, np.float32)}, opt_state=Groups(tuple(groups), "per-group"), clients=clients
    )
    checkpoint.save(tmp_path, state, virtual_time_s=3.25)
    saved = checkpoint.latest(tmp_path)
    back, vt = saved.state, saved.virtual_time_s
    assert vt == 3.25 and back.round == 7 and isinstance(back.opt_state, Groups) and back.opt_state.tag == "per-group"
    for a, b in zip(back.opt_state.adam, groups):
        assert (a.kind, a.eta, a.t) == (b.kind, b.eta, b.t) and a.t > 0
        for moment in ("m", "v"):
            x, y = getattr(a, moment)["w"], getattr(b, moment)["w"]
            assert x.dtype == y.dtype == np.float64 and np.array_equal(x, y)
    assert back.clients.keys() == clients.keys()
    for c, entry in clients.items():
        assert back.clients[c]["reward"] == entry["reward"] and back.clients[c]["seen"] == [c, "x", None]
        assert back.clients[c]["k"] == c
    assert back.weights["w"].dtype == np.float32 and np.array_equal(back.weights["w"], state.weights["w"])


def test_what_cannot_be_checkpointed_is_named(tmp_path):
    state = ServerState(round=1, weights={}, clients={3: {"model": torch.nn.Linear(1, 1)}})
    with pytest.raises(TypeError, match=r"state.clients\[3\]\['model'\]: cannot checkpoint a value of type Linear"):
        checkpoint.save(tmp_path, state, 0.0)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint under"):
        checkpoint.latest(tmp_path)


@pytest.mark.parametrize(
    "base",
    [
        ["model.name=mlp", "algorithm.name=fedadam", "federation.checkpoint_every=2"],
        [
            "algorithm.name=mergesfl",
            "algorithm.ga_generations=20",
            "federation.checkpoint_every=2",
            "federation.lr_schedule={kind: exponential, gamma: 0.9}",
        ],
        ["algorithm.name=inclusivefl", "algorithm.server_lrs=[0.02, 0.01, 0.005]", "federation.checkpoint_every=2"],
        [
            "algorithm.name=fedepth",
            "devices.profile=fedepth_surplus",
            "federation.batch_size=128",
            "federation.checkpoint_every=2",
        ],
        [
            "algorithm.name=depthfl",
            "devices.profile=fedepth_fair",
            "federation.batch_size=128",
            "model.aux_heads=1-2-3-4-6",
            "federation.checkpoint_every=2",
        ],
        [
            "algorithm.name=splitmix",
            "devices.profile=fedepth_fair",
            "federation.batch_size=128",
            "federation.checkpoint_every=2",
        ],
    ],
    ids=["fedadam", "mergesfl", "inclusivefl", "fedepth-mkd", "depthfl", "splitmix"],
)
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path, base):
    base = [*base, "federation.clients_per_round=4"]  # equality, not accuracy: 4 clients a round
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


def test_a_fresh_run_into_an_old_run_dir_leaves_none_of_its_checkpoints(tmp_path):
    """Else a restarted coordinator (or `--resume`) would continue from the other run's round."""
    base = ["model.name=mlp", "federation.checkpoint_every=1"]
    run_local(load_config(None, [*base, "federation.rounds=3"]), tmp_path)
    run_local(load_config(None, [*base, "federation.rounds=2", "seed=1"]), tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round_00001.pt", "round_00002.pt"]
    assert checkpoint.latest(tmp_path).state.round == 2

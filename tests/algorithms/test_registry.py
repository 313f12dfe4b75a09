"""Every registered algorithm runs as named on the default dataset, and honours every optimizer
option or refuses it at config load (never ignores it silently)."""

import numpy as np
import pytest

from rayfl.algorithms import registry
from rayfl.config import ConfigError
from rayfl.engine import build_federation, run_round, torch_threads
from rayfl.load import load_config
from rayfl.runner import InProcessExecutor, run_local

ALGORITHMS = sorted(registry.algorithms())


def test_split_algorithms_take_their_split_model_per_dataset():
    assert load_config(None, ["algorithm.name=mergesfl"]).model.name == "cnn2"
    assert load_config(None, ["algorithm.name=sfl", "data.name=mnist1d"]).model.name == "cnn1d"
    assert load_config(None, ["algorithm.name=fedavg"]).model.name == "cnn"
    assert load_config(None, ["algorithm.name=sfl", "model.name=cnn_h"]).model.name == "cnn_h"  # a named model wins


OPTIONS = {
    "federation.weight_decay": "0.5",
    "federation.momentum": "0.9",
    "federation.grad_clip": "0.001",
    "federation.optimizer": "adam",
}

SMALL = ["data.num_clients=24", "federation.clients_per_round=3", "federation.rounds=1", "federation.batch_size=32"]


def one_round(name, extra):
    """The initial global parameters, and those after one round."""
    cfg = load_config(None, [f"algorithm.name={name}", *SMALL, *extra])
    with torch_threads():
        fed = build_federation(cfg)
        state = fed.policy.init_state(fed.initial_weights())
        out = run_round(fed, state, 1, InProcessExecutor(fed), 0.0)
    return trainable(state), trainable(out.state)


def trainable(state):
    """Float tensors of the global model and of the models kept per client (Local-only trains
    only those; MergeSFL's per-client statistics are not models), by value rather than by the
    engine's module names (SplitMix keeps K copies)."""
    out = {
        k: v
        for k, v in state.weights.items()
        if np.issubdtype(np.asarray(v).dtype, np.floating) and not k.endswith(("running_mean", "running_var"))
    }
    for c, kept in state.clients.items():
        if isinstance(kept, dict) and set(kept) <= set(
            state.weights
        ):  # a model kept per client, not per-client statistics
            out.update(
                (f"client {c}/{k}", v)
                for k, v in kept.items()
                if np.issubdtype(v.dtype, np.floating) and not k.endswith(("running_mean", "running_var"))
            )
    return out


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_optimizer_option_is_honoured_or_refused(name):
    initial, base = one_round(name, [])
    trained = {k for k in base if k not in initial or not np.array_equal(base[k], initial[k])}
    assert trained, "the round trained nothing"
    for key, value in OPTIONS.items():
        try:
            _, changed = one_round(name, [f"{key}={value}"])
        except ConfigError as exc:
            assert str(exc).startswith(key), str(exc)  # refused, naming the key
            continue
        # Honoured: every parameter tensor the round trains comes out differently.
        same = sorted(k for k in trained if np.array_equal(changed[k], base[k]))
        assert not same, f"{key}={value} left {same} as without it"


def test_every_algorithms_config_pickles_by_reference():
    # Configs travel to Ray actors and Tune trials: each config class must be found by its module
    # and name (the baselines' classes are made by a factory), so a trial gets the same class back.
    import pickle

    for name in ALGORITHMS:
        cfg = load_config(None, [f"algorithm.name={name}"])
        back = pickle.loads(pickle.dumps(cfg))
        assert back == cfg and type(back.algorithm) is registry.get(name).config_class, name
        assert back.algorithm.record is registry.get(name), name  # the config carries its algorithm


def test_a_run_asks_the_registry_once(tmp_path, monkeypatch):
    # parse_config resolves the algorithm; the config and then the federation carry its record
    asked, lookup = [], registry.get
    monkeypatch.setattr(registry, "get", lambda name: asked.append(name) or lookup(name))
    config = load_config(None, ["algorithm.name=heterofl", "federation.rounds=1", "metrics.tensorboard=false"])
    run_local(config, tmp_path)
    assert asked == ["heterofl"] and config.algorithm.record is lookup("heterofl")

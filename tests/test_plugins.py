"""An algorithm defined outside rayfl, in one file of a package of its own, found through the entry
point group `rayfl.algorithms` of its `*.dist-info/entry_points.txt` on the path: `rayfl list` shows
it, and `rayfl run --set algorithm.name=<it>` and `rayfl tune` run it on Ray by name."""

import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest

PLUGIN = '''
"""FedMedian: the coordinate-wise median of the clients' models (Yin et al., ICML 2018)."""

import numpy as np

from rayfl.algorithms.base import ServerPolicy
from rayfl.algorithms.fedavg import FedAvgClient
from rayfl.algorithms.registry import Algorithm, register
from rayfl.config import AlgorithmConfig


class FedMedianConfig(AlgorithmConfig):
    name: str = "fedmedian"


class FedMedianPolicy(ServerPolicy):
    def aggregate(self, state, round, results, total):
        if not results:
            return state.replace(round=round)
        stacked = {k: np.stack([r.weights[k] for r in results]) for k in state.weights}
        return state.replace(round=round, weights={k: np.median(v, axis=0).astype(v.dtype) for k, v in stacked.items()})


SUMMARY = "FedMedian: the coordinate-wise median of the clients' models"
register(Algorithm("fedmedian", SUMMARY, FedMedianConfig, FedMedianPolicy, FedAvgClient))
'''


@pytest.fixture
def plugin_path(tmp_path):
    """A folder on no one's path but the test's: the plugin's module and its dist-info."""
    root = tmp_path / "site"
    (root / "rayfl_median").mkdir(parents=True)
    (root / "rayfl_median" / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    info = root / "rayfl_median-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rayfl-median\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rayfl.algorithms]\nfedmedian = rayfl_median\n")
    return root


def rayfl(env, *args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "rayfl", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.ray
@pytest.mark.slow
def test_an_algorithm_from_another_package_is_listed_and_runs_on_ray_and_tune_by_name(plugin_path, tmp_path):
    # a kept head of this test's own (its HOME), whose workers have the plugin on their path as
    # an installed package would be: the run and the Tune sweep both join it
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("RAY_ADDRESS", None)
    listed = rayfl(env, "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "fedmedian" in listed.stdout and "the coordinate-wise median" in listed.stdout
    assert rayfl(env, "up", "--num-cpus", "2", cwd=tmp_path).returncode == 0
    try:
        small = ["--set", "data.num_clients=10", "--set", "federation.clients_per_round=5"]
        run = rayfl(env, "run", "--set", "algorithm.name=fedmedian", "--set", "federation.rounds=3", *small,
                    "--out", str(tmp_path / "run"), cwd=tmp_path)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        (tmp_path / "median.yaml").write_text(
            "base: {algorithm: {name: fedmedian}, data: {num_clients: 10},\n"
            "       federation: {clients_per_round: 5, rounds: 2}}\n"
            "search: {federation.lr: {grid: [0.02, 0.05]}}\nmetric: test_accuracy\nname: median\nstorage: out\n"
        )
        tuned = rayfl(env, "tune", str(tmp_path / "median.yaml"), cwd=tmp_path)
        assert tuned.returncode == 0, tuned.stderr[-2000:]
    finally:
        down = rayfl(env, "down", cwd=tmp_path)
    assert down.stdout.strip() == "rayfl: the local head is down"  # the head was still kept, and it stopped
    rows = pd.read_parquet(tmp_path / "run" / "metrics.parquet")
    assert list(rows["round"]) == [1, 2, 3] and (rows["num_clients"] == 5).all()
    assert rows["test_accuracy"].iloc[-1] > 0.3  # chance is 0.1: the medians learn
    assert "fedmedian" in (tmp_path / "run" / "config.yaml").read_text()
    table = pd.read_csv(tmp_path / "out" / "median" / "results.csv")
    assert len(table) == 2 and (table["status"] == "finished").all() and (table["rounds"] == 2).all()


def test_a_broken_plugin_is_named_each_time_and_never_stops_a_builtin_algorithm(tmp_path, monkeypatch):
    from rayfl.algorithms import registry
    from rayfl.config import ConfigError

    info = tmp_path / "broken-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rayfl.algorithms]\nbroken = rayfl_broken_plugin\n")
    (tmp_path / "rayfl_broken_plugin.py").write_text("raise ImportError('half written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_PLUGINS_LOADED", [])
    assert registry.get("fedavg").name == "fedavg"  # a built-in name never imports the plugins
    for _ in range(2):  # named every time it is asked, not once and then skipped
        with pytest.raises(ConfigError, match=r"entry point broken = rayfl_broken_plugin .*half written"):
            registry.get("fedmedian")

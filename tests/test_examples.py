"""Shipped configs and cluster manifests stay valid."""

from pathlib import Path

import pytest
import yaml

from rayfl.devices import load_profile
from rayfl.load import load_config

ROOT = Path(__file__).resolve().parent.parent


PROFILES = {"phones.yaml"}


@pytest.mark.parametrize(
    "path", sorted(p for p in (ROOT / "examples").rglob("*.yaml") if p.name not in PROFILES), ids=lambda p: p.name
)
def test_example_configs_validate(path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # paths inside a config are relative to the config file, not the working directory
    cfg = load_config(path)
    assert cfg.federation.rounds >= 1
    if cfg.devices.profile.endswith(".yaml"):
        assert load_profile(cfg.devices.profile).classes


@pytest.mark.parametrize("path", sorted((ROOT / "tune").glob("*.yaml")), ids=lambda p: p.name)
def test_tune_experiments_pass_their_checks(path, monkeypatch):
    from tune.spec import load_experiment

    monkeypatch.chdir(ROOT)
    exp = load_experiment(path)  # every grid value validated against its base run config
    assert exp.domains and exp.dir == ROOT / "runs" / "tune" / path.stem


def test_cluster_manifests_parse():
    job = yaml.safe_load((ROOT / "cluster" / "kuberay-rayjob.yaml").read_text())
    assert job["kind"] == "RayJob" and "rayfl" in job["spec"]["entrypoint"]
    spec = job["spec"]["rayClusterSpec"]  # token auth on, the dashboard reachable from the submitter pod
    assert spec["authOptions"] == {"mode": "token"} and tuple(map(int, spec["rayVersion"].split("."))) >= (2, 52)
    assert spec["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    auto = yaml.safe_load((ROOT / "cluster" / "autoscaler.yaml").read_text())
    assert auto["head_node_type"] in auto["available_node_types"]
    assert all("--dashboard-host=127.0.0.1" in c for c in auto["head_start_ray_commands"] if "ray start" in c)

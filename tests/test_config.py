"""Config: validation errors name the key, overrides, YAML round trip."""

import pytest
import yaml

from rayfl.config import ConfigError, DirichletPartition, ShardsPartition
from rayfl.config.files import apply_overrides
from rayfl.load import load_config, parse_config
from rayfl.storage import dump_config


def test_defaults_follow_the_contract():
    cfg = parse_config({})
    assert (cfg.data.name, cfg.data.num_clients, cfg.model.name, cfg.algorithm.name) == ("digits", 20, "cnn", "fedavg")
    assert cfg.data.partition == DirichletPartition(alpha=0.5)
    assert (cfg.federation.rounds, cfg.federation.clients_per_round, cfg.devices.profile) == (30, 10, "jetson")
    assert cfg.clock == "virtual" and cfg.ray.num_actors == "auto"


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"federation": {"bogus": 1}}, "federation.bogus: unknown key"),
        ({"federation": {"lr": "fast"}}, "federation.lr:"),
        ({"federation": {"lr": 0}}, "federation.lr: Input should be greater than 0"),
        ({"data": {"partition": {"kind": "dirichlet", "alpha": -1}}}, "data.partition.alpha:"),
        ({"data": {"partition": {"kind": "iid", "alpha": 0.5}}}, "data.partition.alpha: unknown key"),
        ({"data": {"partition": {"kind": "zipf"}}}, "data.partition.kind:"),
        ({"algorithm": {"name": "fedprox", "mu": -0.1}}, "algorithm.mu:"),
        ({"algorithm": {"name": "fedavg", "mu": 0.1}}, "algorithm.mu: unknown key"),
        ({"algorithm": {"name": "nope"}}, "algorithm.name: unknown algorithm 'nope'"),
        ({"model": {"name": "cnn", "rate": 2}}, "model.rate:"),
        ({"model": {"name": "cnn", "norm": "batch"}}, "model.norm:"),
        ({"clock": "wall"}, "clock:"),
        ({"ray": {"num_actors": 0}}, "ray.num_actors"),
        ({"seed": -1}, "seed:"),
    ],
)
def test_errors_name_the_offending_key(raw, key):
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    assert str(err.value).startswith(key), str(err.value)
    assert "\n" not in str(err.value)


def test_round_size_cannot_exceed_population():
    with pytest.raises(ConfigError, match="clients_per_round .*exceeds data.num_clients"):
        parse_config({"data": {"num_clients": 5}, "federation": {"clients_per_round": 6}})


def test_dotted_overrides_are_yaml_typed_and_leave_the_input_alone():
    raw = {"federation": {"lr": 0.1}}
    out = apply_overrides(
        raw,
        [
            "federation.lr=0.5",
            "data.partition={kind: shards, classes_per_client: 2}",
            "algorithm.name=fedprox",
            "algorithm.mu=1e-2",
        ],
    )
    assert raw == {"federation": {"lr": 0.1}}
    cfg = parse_config(out)
    assert cfg.federation.lr == 0.5
    assert cfg.data.partition == ShardsPartition(classes_per_client=2)
    assert cfg.algorithm.mu == pytest.approx(0.01)


@pytest.mark.parametrize("bad", ["federation.lr", "=3", "a..b=1"])
def test_malformed_overrides(bad):
    with pytest.raises(ConfigError, match="--set"):
        apply_overrides({}, [bad])


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = load_config(
        None,
        [
            "algorithm.name=fedadam",
            "algorithm.beta2=0.999",
            "model.name=mlp",
            "model.hidden=[32, 16]",
            "data.partition.kind=iid",
        ],
    )
    path = tmp_path / "config.yaml"
    dump_config(cfg, path)
    again = load_config(path)
    assert again == cfg
    assert yaml.safe_load(path.read_text())["algorithm"]["beta2"] == 0.999
    assert again.model.hidden == (32, 16)


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("federation: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+ invalid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="missing.yaml: no such file"):
        load_config(tmp_path / "missing.yaml")


def test_one_key_of_a_tagged_section_sets_alone_on_top_of_the_defaults():
    assert parse_config(apply_overrides({}, ["data.partition.alpha=0.1"])).data.partition == DirichletPartition(
        alpha=0.1
    )
    # A section that names its own kind is taken as written: keys of another kind are errors.
    with pytest.raises(ConfigError, match="^data.partition.alpha: unknown key"):
        parse_config(apply_overrides({"data": {"partition": {"kind": "iid"}}}, ["data.partition.alpha=0.1"]))
    with pytest.raises(ConfigError, match="^federation.lr_schedule.gamma: unknown key"):  # the default is constant
        parse_config(apply_overrides({}, ["federation.lr_schedule.gamma=0.5"]))


def test_duplicate_keys_and_ratios_in_yaml(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("seed: 1\ndata:\n  name: digits\n  name: mnist1d\n")
    with pytest.raises(ConfigError, match=r"dup.yaml: line 4 duplicate key 'name'"):
        load_config(dup)
    ratio = tmp_path / "mix.yaml"
    ratio.write_text("devices:\n  mix: 1:2:7\n")  # YAML 1.1 would read 1:2:7 as the base-60 number 3727
    assert load_config(ratio).devices.mix == "1:2:7" and load_config(None, ["devices.mix=7:2:1"]).devices.mix == "7:2:1"

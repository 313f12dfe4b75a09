"""TUNE.yaml checks: every bad search spec fails before any trial, with one line naming the key."""

import math

import pandas as pd
import pytest
import yaml

from rayfl.cli import main
from rayfl.config import ConfigError
from tune.spec import load_experiment

BASE = {"data": {"name": "digits", "num_clients": 4}, "federation": {"rounds": 2, "clients_per_round": 2}}


def write(tmp_path, search, **extra):
    import yaml

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"base": BASE, "search": search, "storage": str(tmp_path / "runs"), **extra}))
    return path


@pytest.mark.parametrize(
    "search, message",
    [
        ({"federation.lrr": {"grid": [0.1]}}, r"search.federation.lrr = 0.1: federation.lrr: unknown key"),
        ({"federation.lr": {"grid": []}}, r"search.federation.lr: grid needs a non-empty list of values"),
        ({"federation.lr": {"normal": [0, 1]}}, r"search.federation.lr: write one of \{grid: ... \| choice: ..."),
        ({"federation.lr": [0.1, 0.2]}, r"search.federation.lr: write one of"),
        (
            {"federation.lr": {"uniform": [0.2, 0.1]}},
            r"search.federation.lr: uniform needs low < high, got \[0.2, 0.1\]",
        ),
        ({"federation.lr": {"loguniform": [0, 0.1]}}, r"search.federation.lr: loguniform needs low > 0"),
        ({"federation.rounds": {"randint": [1.5, 4]}}, r"search.federation.rounds: randint needs integer bounds"),
        (
            {"federation.lr": {"grid": [0.1, -1]}},
            r"search.federation.lr = -1: federation.lr: Input should be greater than 0",
        ),
        (
            {"devices.mix": {"choice": ["1:1:1", "1:2"]}},
            r"search.devices.mix = '1:2': devices.mix: '1:2' has 2 numbers",
        ),
        (
            {"algorithm.levels": {"grid": ["a1-b1"]}},
            r"search.algorithm.levels = 'a1-b1': algorithm.levels: unknown key",
        ),
    ],
)
def test_bad_search_specs_fail_before_any_trial_with_one_line(tmp_path, capsys, search, message):
    path = write(tmp_path, search)
    with pytest.raises(ConfigError, match=message):
        load_experiment(path)
    assert main(["tune", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rayfl: error: ") and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_metric_and_search_algorithm_checks(tmp_path, monkeypatch):
    from tune import spec

    good = {"federation.lr": {"grid": [0.1]}}
    with pytest.raises(ConfigError, match="metric: 'accuracy' is not one of test_accuracy"):
        load_experiment(write(tmp_path, good, metric="accuracy"))
    with pytest.raises(ConfigError, match="time_to_target_s needs federation.target_accuracy"):
        load_experiment(write(tmp_path, good, metric="time_to_target_s"))
    monkeypatch.setattr(spec, "installed", lambda package: False)
    with pytest.raises(ConfigError, match=r"search_alg: optuna needs the package 'optuna': pip install optuna"):
        load_experiment(write(tmp_path, good, search_alg="optuna"))
    monkeypatch.setattr(spec, "installed", lambda package: True)
    with pytest.raises(ConfigError, match=r"search.federation.lr: grid works only with search_alg: none; use choice"):
        load_experiment(write(tmp_path, good, search_alg="hyperopt"))
    choice = load_experiment(write(tmp_path, {"federation.lr": {"choice": [0.1, 0.2]}}, search_alg="hyperopt"))
    assert choice.spec.search_alg == "hyperopt"


def test_a_good_spec_resolves_domains_defaults_and_base_overrides(tmp_path):
    exp = load_experiment(
        write(
            tmp_path,
            {"federation.lr": {"loguniform": [0.01, 0.1]}, "devices.mix": {"grid": ["1:1:1", "0:0:1"]}},
            metric="test_loss",
        ),
        ["federation.rounds=3"],
    )
    assert exp.domains == {"federation.lr": ("loguniform", [0.01, 0.1]), "devices.mix": ("grid", ["1:1:1", "0:0:1"])}
    assert exp.spec.direction == "min"  # test_loss's natural direction
    assert exp.base_config.federation.rounds == 3 and exp.base_config.federation.lr == 0.01
    assert exp.dir == (tmp_path / "runs" / "exp").resolve()


def test_time_to_target_is_the_first_virtual_time_at_the_target_across_a_resume(monkeypatch):
    from tune import run as tune_run

    reported = []
    monkeypatch.setattr(tune_run.tune, "report", reported.append)
    nan = math.nan
    # rounds 1-2 ran before the interruption; accuracy 0.85 >= 0.8 first at round 2 (virtual 20 s)
    history = pd.DataFrame(
        {"round": [1, 2, 3], "test_accuracy": [0.5, 0.85, 0.9], "virtual_time_s": [10.0, 20.0, 30.0]}
    )
    report = tune_run.Reporter(0.8, history)
    report({"round": 3, "test_accuracy": 0.7, "virtual_time_s": 31.0})
    report({"round": 4, "test_accuracy": nan, "virtual_time_s": 40.0})  # not evaluated: not reported
    assert [(r["round"], r["time_to_target_s"]) for r in reported] == [(3, 20.0)]
    fresh = tune_run.Reporter(0.8)
    fresh({"round": 1, "test_accuracy": 0.7, "virtual_time_s": 5.0})
    fresh({"round": 2, "test_accuracy": 0.81, "virtual_time_s": 9.0})
    assert [r["time_to_target_s"] for r in reported[1:]] == [math.inf, 9.0]


def test_without_the_pool_each_client_actor_gets_one_bundle_sized_to_it():
    from rayfl.load import parse_config
    from tune.run import bundles

    cfg = parse_config({"ray": {"num_actors": 2, "cpus_per_actor": 0.5, "gpus_per_actor": 0.25, "pool_idle_s": 0}})
    assert bundles(cfg, 0.0) == [{"CPU": 0.0}, {"CPU": 0.5, "GPU": 0.25}, {"CPU": 0.5, "GPU": 0.25}]
    assert bundles(parse_config({"ray": {"pool_idle_s": 0}}), 0.5) == [
        {"CPU": 0.5},
        {"CPU": 1.0},
    ]  # num_actors auto: 1 in a trial


def test_with_the_pool_a_trial_reserves_its_driver_only_and_concurrency_fits_the_actors(tmp_path):
    from rayfl.load import parse_config
    from tune.run import bundles, concurrent_trials

    cfg = parse_config({"ray": {"num_actors": 2, "cpus_per_actor": 0.5, "gpus_per_actor": 0.25}})
    assert bundles(cfg, 0.0) == [
        {"CPU": 0.0, "node:__internal_head__": 0.001}
    ]  # pooled actors live outside trial groups
    path = tmp_path / "t.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "base": {"ray": {"num_actors": 2, "cpus_per_actor": 0.5, "gpus_per_actor": 0.25}},
                "search": {"federation.lr": {"grid": [0.1]}},
                "max_concurrent_trials": 8,
            }
        )
    )
    exp = load_experiment(path)
    assert (
        concurrent_trials(exp, {"CPU": 4.0, "GPU": 2.0}) == 4
    )  # 2 actors x 0.25 GPU = 0.5 GPU a trial: 4 on 2 GPUs (CPUs would fit 4 too)
    assert concurrent_trials(exp, {"CPU": 1.0, "GPU": 2.0}) == 1  # 2 x 0.5 CPU: one trial on 1 CPU
    assert concurrent_trials(exp, {"CPU": 64.0, "GPU": 64.0}) == 8  # never above the spec's
    assert (
        concurrent_trials(load_experiment(path, ["ray.pool_idle_s=0"]), {"CPU": 1.0, "GPU": 0.0}) == 8
    )  # groups wait for room themselves


def test_results_rows_carry_the_final_value_of_each_groups_metric():
    from tune.run import metric_columns

    history = pd.DataFrame(
        {
            "round": [1, 2, 3],
            "test_accuracy": [0.5, 0.7, 0.6],
            "test_accuracy@weak": [0.4, 0.5, 0.55],
            "test_loss@weak": [2.0, 1.5, 1.2],
        }
    )
    assert metric_columns(history, "test_accuracy", max) == {
        "final_test_accuracy": 0.6,
        "best_test_accuracy": 0.7,
        "final_test_accuracy@weak": 0.55,
    }
    assert metric_columns(history, "test_loss@weak", min) == {"final_test_loss@weak": 1.2, "best_test_loss@weak": 1.2}
    empty = metric_columns(pd.DataFrame(), "test_accuracy", max)
    assert set(empty) == {"final_test_accuracy", "best_test_accuracy"} and all(math.isnan(v) for v in empty.values())


def test_logger_callbacks_need_their_package_and_take_only_their_options(tmp_path, monkeypatch, capsys):
    from tune import spec

    good = {"federation.lr": {"grid": [0.1]}}
    monkeypatch.setattr(spec, "installed", lambda package: package != "wandb")
    with pytest.raises(ConfigError, match=r"callbacks.wandb: needs the package 'wandb': pip install wandb"):
        load_experiment(write(tmp_path, good, callbacks={"wandb": {}}))
    with pytest.raises(ConfigError, match=r"callbacks.mlflow: got an unexpected keyword argument 'tracking'"):
        load_experiment(write(tmp_path, good, callbacks={"mlflow": {"tracking": "x"}}))
    path = write(tmp_path, good, callbacks={"tensorboard": {}})
    assert main(["tune", str(path)]) == 2 and "callbacks.tensorboard" in capsys.readouterr().err
    exp = load_experiment(write(tmp_path, good, callbacks={"mlflow": {"tracking_uri": "sqlite:///x.db"}}))
    assert exp.spec.callbacks == {"mlflow": {"tracking_uri": "sqlite:///x.db"}}


def test_the_bar_shows_the_best_final_metric_of_trials_that_ran_all_their_rounds(tmp_path, monkeypatch):
    # the definition of the best trial `rayfl tune` names at its end: never a trial's best round,
    # nor the last round of a trial ASHA stopped or one that failed
    from types import SimpleNamespace

    import tqdm

    from tune.run import TrialBar

    shown = []
    monkeypatch.setattr(
        tqdm,
        "tqdm",
        lambda **kw: SimpleNamespace(
            set_postfix=lambda d, refresh: shown.append(d), update=lambda n: None, close=lambda: None
        ),
    )
    bar = TrialBar(load_experiment(write(tmp_path, {"federation.lr": {"grid": [0.1]}})), total=4)
    trial = SimpleNamespace
    report = lambda t, *rows: [bar.on_trial_result(0, [], t, {"round": r, "test_accuracy": a}) for r, a in rows]
    a, b, c, d = (trial(trial_id=k) for k in "abcd")
    report(a, (1, 0.52), (2, 0.40))  # its best round (0.52) is not its final one
    bar.on_trial_complete(0, [], a)
    report(b, (1, 0.90))  # stopped early at round 1 of 2
    bar.on_trial_complete(0, [], b)
    report(c, (1, 0.6), (2, 0.95))  # failed after its last report
    bar.on_trial_error(0, [], c)
    report(d, (1, 0.3), (2, 0.45))
    bar.on_trial_complete(0, [], d)
    assert shown == [{"best final test_accuracy": f"{v:.4f}"} for v in (0.40, 0.40, 0.40, 0.45)]

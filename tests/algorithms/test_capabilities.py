"""A server policy's core is six verbs; the rest are capabilities the engine finds by protocol
(rayfl/algorithms/capabilities.py), each tested here on a policy that has it and one that has not."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from rayfl.algorithms import aggregate, registry
from rayfl.algorithms.base import CORE, HELPERS, ServerPolicy
from rayfl.algorithms.capabilities import (
    ChecksConfig,
    ClientAccount,
    Collapses,
    Costs,
    DrivesRounds,
    Eligible,
    Personalizes,
    ReportsRounds,
    Summarizes,
    Sums,
    train_cost,
)
from rayfl.algorithms.fedavg import FedAvgClient, FedAvgConfig, FedAvgPolicy
from rayfl.config import ConfigError
from rayfl.engine import build_federation, prepare, run_federation, start_of, torch_threads
from rayfl.load import load_config
from rayfl.runner import InProcessExecutor

SMALL = ["model.name=mlp", "model.hidden=[8]", "data.num_clients=12", "federation.clients_per_round=4"]


def run_with(policy_class, tmp_path, *sets, rounds=2):
    """A small FedAvg federation run in process with `policy_class` as its policy."""
    cfg = load_config(None, [*SMALL, f"federation.rounds={rounds}", "metrics.tensorboard=false", *sets])
    with torch_threads():
        fed = build_federation(cfg)
        policy = policy_class(cfg, fed.context)
        fed = dataclasses.replace(fed, policy=policy, account=ClientAccount.of(policy))
        summary = run_federation(fed, InProcessExecutor(fed), tmp_path, start_of(fed, tmp_path, False))
    return summary, pd.read_parquet(tmp_path / "metrics.parquet"), pd.read_parquet(tmp_path / "clients.parquet")


def test_the_core_is_six_verbs_and_every_other_public_method_is_a_helper():
    public = {n for n, v in vars(ServerPolicy).items() if callable(v) and not n.startswith("_")}
    assert len(CORE) <= 6 and public == set(CORE) | set(HELPERS)
    bare = ServerPolicy.__new__(ServerPolicy)
    capabilities = (Eligible, Collapses, ReportsRounds, Summarizes, Personalizes, DrivesRounds, Sums, Costs)
    assert [c.__name__ for c in capabilities if isinstance(bare, c)] == []
    assert not issubclass(ServerPolicy, ChecksConfig)


def test_each_builtin_policy_has_the_capabilities_it_defines_and_only_those():
    have = {
        name: {c.__name__ for c in (Eligible, Sums, Costs, DrivesRounds, Personalizes) if issubclass(a.policy, c)}
        for name, a in registry.builtin().items()
    }
    assert have["fedavg"] == {"Sums"}
    assert have["heterofl"] == {"Sums", "Eligible"}
    assert have["sfl"] == have["mergesfl"] - {"Personalizes"} == {"Eligible", "Costs", "DrivesRounds"}
    assert have["ditto"] == {"Sums", "Costs", "Personalizes"}
    assert have["localonly"] == {"Costs", "Personalizes"}


class EvenOnly(FedAvgPolicy):
    def eligible(self, round):
        return np.arange(self.context.num_clients) % 2 == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_eligible_clients_are_the_only_ones_selected(tmp_path, mode):
    sets = ["federation.async.buffer_size=2"] if mode == "async" else []
    _, _, clients = run_with(EvenOnly, tmp_path, f"federation.mode={mode}", *sets)
    assert len(clients) and (clients["client_id"] % 2 == 0).all()
    _, _, everyone = run_with(FedAvgPolicy, tmp_path / "all", f"federation.mode={mode}", *sets, rounds=4)
    assert (everyone["client_id"] % 2 == 1).any()


class Reporting(FedAvgPolicy):
    def round_metrics(self, state, round, tasks):
        return {"tasks_out": float(len(tasks))}

    def summary(self):
        return {"reported": "yes"}


def test_round_reports_and_summary_entries_reach_the_tables(tmp_path):
    summary, metrics, _ = run_with(Reporting, tmp_path)
    assert list(metrics["tasks_out"]) == [4.0, 4.0] and summary["reported"] == "yes"
    assert json.loads((tmp_path / "summary.json").read_text())["reported"] == "yes"
    summary, metrics, _ = run_with(FedAvgPolicy, tmp_path / "plain")
    assert "tasks_out" not in metrics and "reported" not in summary


class OwnPersonal(FedAvgPolicy):
    def personalize(self, state, round, evaluator):
        return {"initial_accuracy": 0.25, "personal_accuracy": 0.75}


def test_a_policy_that_personalizes_is_scored_by_its_own_models(tmp_path):
    _, metrics, _ = run_with(OwnPersonal, tmp_path, "federation.personalize_epochs=1")
    assert list(metrics["personal_accuracy"]) == [0.75, 0.75]
    _, metrics, _ = run_with(FedAvgPolicy, tmp_path / "head", "federation.personalize_epochs=1")
    head = metrics["personal_accuracy"]  # the global model with its head fine-tuned per client
    assert head.between(0, 1).all() and not (head == 0.75).any() and "personal_accuracy_std" in metrics


class Triple(FedAvgPolicy):
    def client_cost(self, task, result):
        flops, down, up = train_cost(self.context, task, result)
        return 3 * flops, down, up + 7


def test_a_policys_own_costs_are_what_each_client_is_charged(tmp_path):
    _, _, own = run_with(Triple, tmp_path)
    _, _, plain = run_with(FedAvgPolicy, tmp_path / "plain")
    np.testing.assert_array_equal(own["flops"], 3 * plain["flops"])
    np.testing.assert_array_equal(own["bytes_up"], plain["bytes_up"] + 7)


SHAPES = []


class Watching(FedAvgPolicy):
    """FedAvg recording what each call of its aggregate is handed."""

    def aggregate(self, state, round, results, total):
        SHAPES.append((len(results), all(not r.weights for r in results), bool(total)))
        return super().aggregate(state, round, results, total)


class Averaging(ServerPolicy):
    """A plain mean of the clients' weights: no summand, so each result arrives whole."""

    def aggregate(self, state, round, results, total):
        SHAPES.append((len(results), all(bool(r.weights) for r in results), not total))
        if not results:
            return state.replace(round=round)
        weights = {
            k: np.mean([r.weights[k] for r in results], axis=0).astype(v.dtype) for k, v in state.weights.items()
        }
        return state.replace(round=round, weights=weights)


@pytest.mark.parametrize(
    "sets",
    [
        ["federation.mode=sync"],
        ["federation.mode=deadline", "federation.deadline.target_clients=2", "federation.deadline.late=carry"],
        ["federation.mode=async", "federation.async.buffer_size=2"],
        ["federation.mode=async", "federation.async.rule=fedasync"],
    ],
)
def test_a_summing_policys_aggregate_gets_one_shape_in_every_mode(tmp_path, sets):
    # the total of the summands and results without weights, whatever the scheduler
    SHAPES.clear()
    run_with(Watching, tmp_path, *sets, rounds=3)
    assert len(SHAPES) == 3 and all(n and weightless and total for n, weightless, total in SHAPES), SHAPES
    assert issubclass(Watching, Sums) and not issubclass(Averaging, Sums)


def test_a_policy_that_does_not_sum_gets_every_result_whole(tmp_path):
    SHAPES.clear()
    _, metrics, _ = run_with(Averaging, tmp_path, rounds=2)
    assert len(SHAPES) == 2 and all(n == 4 and whole and empty for n, whole, empty in SHAPES)
    assert metrics["test_accuracy"].iloc[-1] > 0.1


class Picky(FedAvgPolicy):
    @classmethod
    def check_config(cls, config):
        if config.federation.local_epochs > 1:
            raise ConfigError("federation.local_epochs: picky trains one epoch")

    def collapsed(self):
        return "nothing to adapt to"


class PickyConfig(FedAvgConfig):
    name: str = "picky"


registry.register(registry.Algorithm("picky", "a test's policy with config checks", PickyConfig, Picky, FedAvgClient))


def test_config_checks_refuse_at_load_and_a_collapse_warns_before_the_run(tmp_path, rayfl_notes):
    with pytest.raises(ConfigError, match="federation.local_epochs: picky trains one epoch"):
        load_config(None, ["algorithm.name=picky", "federation.local_epochs=2"])
    assert load_config(None, ["algorithm.name=fedavg", "federation.local_epochs=2"]).federation.local_epochs == 2
    prepare(load_config(None, [*SMALL, "algorithm.name=picky"]), tmp_path)
    assert [m for m in rayfl_notes if "picky" in m and "nothing to adapt to" in m]
    assert issubclass(Picky, ChecksConfig) and isinstance(Picky.__new__(Picky), Collapses)


class NotSumming(FedAvgPolicy):
    summand = None  # opts out of FedAvg's sum: every result arrives whole

    def aggregate(self, state, round, results, total):
        SHAPES.append((len(results), all(bool(r.weights) for r in results), not total))
        return super().aggregate(
            state, round, results, aggregate.add_up(aggregate.weighted_sum(r.weights, r.num_examples) for r in results)
        )


def test_an_inherited_capability_set_to_none_is_opted_out_of(tmp_path):
    SHAPES.clear()
    run_with(NotSumming, tmp_path, rounds=1)
    assert SHAPES == [(4, True, True)]


def test_the_old_sums_flag_is_refused_at_registration():
    class Flagged(FedAvgPolicy):
        sums = False

    class FlaggedConfig(FedAvgConfig):
        name: str = "flagged"

    with pytest.raises(ValueError, match="Flagged.sums is not read"):
        registry.register(registry.Algorithm("flagged", "", FlaggedConfig, Flagged, FedAvgClient))


def test_a_config_changed_after_parsing_names_no_algorithm():
    config = load_config(None, ["algorithm.name=fedprox"])
    changed = config.model_copy(update={"algorithm": config.algorithm.model_copy(update={"name": "fedavg"})})
    with pytest.raises(ConfigError, match="not parsed by rayfl.load.parse_config"):
        build_federation(changed)

"""Tune over federations on the session's 2-CPU Ray cluster: ASHA, placement groups, best re-run."""

import json

import pandas as pd
import pytest
import yaml
from ray.tune import Callback

from rayfl.cli import main
from rayfl.config import ConfigError
from tune.run import run_experiment
from tune.spec import load_experiment

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BASE = {
    "data": {"name": "digits", "num_clients": 10, "partition": {"kind": "iid"}},
    "model": {"name": "cnn"},
    "federation": {"rounds": 4, "clients_per_round": 4, "batch_size": 10, "lr": 0.05, "eval_batch_size": 1000},
    "ray": {"num_actors": 1, "cpus_per_actor": 1},
}


class AtEachResult(Callback):
    """Calls `step()` in Tune's driver as each trial result comes in: the trials' runs go on
    meanwhile, at most a round ahead of their reports (`ray.rounds_ahead=1`), so each call sees the
    actors as they are while a trial runs, however slow the machine."""

    def __init__(self, step):
        self.step = step

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.step()


def our_actors(ray, run_prefix, role):
    """(run id, name, handle) of the live actors in `role` of runs `<run_prefix>...`: their own
    (`rayfl:<run>:<role>...`) and those they borrowed from the warm pool."""
    from actors.driver import pool

    keeper = pool.keeper(create=False)
    leases = [] if keeper is None else ray.get(keeper.status.remote())["leased"]
    owners = {name: held["run"] for held in leases if held["run"].startswith(run_prefix) for name in held["actors"]}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"]
        own = name.startswith(f"rayfl:{run_prefix}")
        if (own or name in owners) and name.split(":")[-1].startswith(role):
            try:
                handle = ray.get_actor(name, namespace=actor["namespace"])
            except ValueError:  # it died since the listing
                continue
            yield (name.split(":")[1] if own else owners[name]), name, handle


def experiment(tmp_path, name, search, **extra):
    path = tmp_path / f"{name}.yaml"
    spec = {"base": BASE, "search": search, "storage": str(tmp_path / "runs"), "max_concurrent_trials": 2, **extra}
    path.write_text(yaml.safe_dump(spec))
    return path


def test_asha_grid_stops_poor_trials_and_the_best_config_reproduces(ray_cluster, tmp_path, capsys, monkeypatch):
    # Two learning rates that learn and two that cannot move off chance (10 classes: ~0.1) in one
    # round. Trials of 2 rounds: ASHA has one rung (grace 1 x factor 2 = max_t 2: round 1) and stops
    # a trial whose round-1 accuracy is below the median of those recorded there before it. The good trials
    # start first (grid order, 2 at a time) and one of them may stop the other; a poor trial starts
    # only after a good one has left, so both good values are recorded and it is stopped.
    path = experiment(
        tmp_path,
        "asha",
        {"federation.lr": {"grid": [0.1, 0.08, 1e-5, 2e-5]}},
        scheduler={"name": "asha", "grace_period": 1, "reduction_factor": 2},
        callbacks={"mlflow": {"tracking_uri": f"file://{tmp_path}/mlruns"}},  # Tune's MLflow logger beside its own
    )
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for a database unless told a folder is fine
    exp = load_experiment(path, ["federation.rounds=2"])
    out = run_experiment(exp, verbose=0)
    table = out["table"]
    assert len(table) == 4 and (table["error"] == "").all()
    by_lr = table.set_index("federation.lr")
    assert by_lr.loc[[1e-5, 2e-5], "stopped_early"].all() and (by_lr.loc[[1e-5, 2e-5], "rounds"] == 1).all()
    good = by_lr.loc[[0.1, 0.08]]
    assert (~good["stopped_early"]).sum() >= 1 and set(good["rounds"]) <= {1, 2}
    at_rung = {
        lr: pd.read_parquet(f"{d}/metrics.parquet").set_index("round").loc[1, "test_accuracy"]
        for lr, d in by_lr["run_dir"].items()
    }
    leader = max(at_rung, key=at_rung.get)
    assert (
        not by_lr.loc[leader, "stopped_early"] and by_lr.loc[leader, "rounds"] == 2
    )  # ASHA never stops the rung leader
    assert pd.read_parquet(exp.dir / "results.parquet").equals(
        pd.read_csv(exp.dir / "results.csv", keep_default_na=False)
    )
    assert (exp.dir / "trials.png").stat().st_size > 0

    # MLflow has a run per trial (experiment named after Tune's) with its searched lr and every round it reported.
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"file://{tmp_path}/mlruns")
    runs = client.search_runs([client.get_experiment_by_name("asha").experiment_id])
    logged = {
        float(r.data.params["federation.lr"]): [
            m.value for m in sorted(client.get_metric_history(r.info.run_id, "test_accuracy"), key=lambda m: m.step)
        ]
        for r in runs
    }
    assert logged.keys() == set(by_lr.index)
    for lr, accuracy in logged.items():  # a stopped trial's run may record a round or two more than it reported
        recorded = pd.read_parquet(f"{by_lr.loc[lr, 'run_dir']}/metrics.parquet")["test_accuracy"].tolist()
        assert len(accuracy) == by_lr.loc[lr, "rounds"] and accuracy == pytest.approx(recorded[: len(accuracy)])

    best = out["best"]
    finished = table[table["status"] == "finished"]
    assert set(table["status"]) <= {"finished", "stopped early"}
    assert best["final_test_accuracy"] == finished["final_test_accuracy"].max() and best["federation.lr"] in (0.1, 0.08)
    run_metrics = pd.read_parquet(f"{best['run_dir']}/metrics.parquet")  # the trial's own RUN_DIR, under the experiment
    assert run_metrics["test_accuracy"].iloc[-1] == best["final_test_accuracy"] and len(run_metrics) == 2

    # `rayfl run best.yaml` (on Ray, as a user would) gives the trial's final metric exactly.
    assert main(["run", str(exp.dir / "best.yaml"), "--out", str(tmp_path / "rerun")]) == 0
    summary = json.loads((tmp_path / "rerun" / "summary.json").read_text())
    assert summary["final_test_accuracy"] == best["final_test_accuracy"]

    # The same experiment again is refused; Tune's restore of a finished one re-runs nothing.
    with pytest.raises(ConfigError, match="exists; pass --resume"):
        run_experiment(exp, verbose=0)
    again = run_experiment(exp, resume=True, verbose=0)["table"]
    pd.testing.assert_frame_equal(again, table)


def test_without_the_pool_concurrent_trials_keep_their_client_actors_inside_their_placement_groups(
    idle_cluster, tmp_path
):
    ray = idle_cluster
    # Each trial asks for 1 CPU of client actors (2 x 0.5) and nothing for its coordinator, so two
    # trials fill the 2 CPUs and run at once.
    path = experiment(
        tmp_path,
        "placed",
        {"federation.lr": {"grid": [0.05, 0.1]}},
        coordinator_cpus=0,
    )
    exp = load_experiment(
        path,
        [
            "ray.num_actors=2",
            "ray.cpus_per_actor=0.5",
            "federation.rounds=6",
            "ray.pool_idle_s=0",
            "ray.rounds_ahead=1",
        ],
    )
    samples = []

    def sample():
        seen = {}
        for _, name, actor in our_actors(ray, "placed-", "client-"):
            try:
                seen[name] = ray.get(actor.info.remote(), timeout=10)["placement_group"]
            except Exception:  # the trial ended and killed it meanwhile
                continue
        if seen:
            samples.append((seen, ray.util.placement_group_table()))

    table = run_experiment(exp, verbose=0, callbacks=[AtEachResult(sample)])["table"]
    assert len(table) == 2 and (table["status"] == "finished").all() and (table["rounds"] == 6).all()

    trials_of = lambda seen: {name.split(":")[1] for name in seen}  # run ids: placed-<trial_id>
    assert any(len(trials_of(seen)) == 2 for seen, _ in samples), "the two trials never ran at once"
    group_of_trial = {}
    for seen, groups in samples:
        assert len(seen) <= 4  # 2 trials x 2 reserved client bundles
        for name, pg in seen.items():
            run_id = name.split(":")[1]
            assert pg in groups  # (a finished trial's group may already read REMOVED here)
            assert group_of_trial.setdefault(run_id, pg) == pg  # every client of a trial in that trial's group
            bundles = list(groups[pg]["bundles"].values())
            assert [b.get("CPU", 0) for b in bundles] == [0.5, 0.5]  # Tune leaves out the empty head bundle
        for pg in set(seen.values()):
            assert sum(1 for p in seen.values() if p == pg) <= 2  # never more clients than the group's bundles
    assert len(group_of_trial) == 2 and len(set(group_of_trial.values())) == 2


def test_trials_borrow_warm_actors_one_trial_at_a_time_and_the_next_trials_reuse_them(idle_cluster, tmp_path):
    ray = idle_cluster
    from actors.driver import pool

    # 4 trials of 2 client actors x 0.5 CPU: two at once fill the 2 CPUs; the next two borrow
    # the actors the first two handed back.
    path = experiment(tmp_path, "warm", {"federation.lr": {"grid": [0.05, 0.1, 0.02, 0.08]}})
    exp = load_experiment(
        path, ["ray.num_actors=2", "ray.cpus_per_actor=0.5", "federation.rounds=3", "ray.rounds_ahead=1"]
    )
    samples = []

    def sample():
        keeper = pool.keeper(create=False)
        if keeper is not None:
            samples.append(
                [held for held in ray.get(keeper.status.remote())["leased"] if held["run"].startswith("warm-")]
            )

    table = run_experiment(exp, verbose=0, callbacks=[AtEachResult(sample)])["table"]
    assert len(table) == 4 and (table["status"] == "finished").all()
    clients = lambda held: [name for name in held["actors"] if ":client-" in name]
    assert any(len(leases) == 2 for leases in samples), "two trials never ran at once"
    for leases in samples:
        names = [name for held in leases for name in held["actors"]]
        assert len(names) == len(set(names))  # no actor lent to two trials at once
        assert all(len(clients(held)) <= 2 for held in leases)  # (a lease shows its new actors once they started)
    used = {name for leases in samples for held in leases for name in clients(held)}
    assert (
        len({held["run"] for leases in samples for held in leases}) == 4 and len(used) == 4
    )  # 8 client actors without reuse


def test_an_interrupted_trial_resumes_from_its_checkpoint_through_tunes_restore(ray_cluster, tmp_path):
    ray = ray_cluster
    from rayfl.runner import run_local

    path = experiment(tmp_path, "broken", {"federation.lr": {"grid": [0.1]}})
    exp = load_experiment(path, ["federation.rounds=6", "federation.checkpoint_every=2", "ray.rounds_ahead=1"])
    killed = tmp_path / "killed"  # the round whose report made the kill, the rounds recorded then
    # (a file: Tune's restore unpickles the fit's callbacks, which must then do nothing)

    class KillTheCoordinatorAtRound3(Callback):  # runs here, in Tune's driver, as each report comes
        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result["round"] >= 3 and not killed.exists():
                for _, _, coordinator in our_actors(ray, "broken-", "coordinator"):
                    ray.kill(coordinator)
                runs = list(exp.dir.glob("*/run/metrics.parquet"))
                killed.write_text(json.dumps([result["round"], len(pd.read_parquet(runs[0]))]))

    first = run_experiment(exp, verbose=0, callbacks=[KillTheCoordinatorAtRound3()])["table"]
    assert first["status"].tolist() == ["error"] and first["error"].iloc[0]
    reported, recorded = json.loads(killed.read_text())
    assert reported == 3 and recorded <= 4  # under rounds_ahead=1: before round 5 was recorded
    stopped_at = len(pd.read_parquet(first["run_dir"].iloc[0] + "/metrics.parquet"))
    assert 3 <= stopped_at < 6

    again = run_experiment(exp, resume=True, verbose=0)  # Tuner.restore(resume_errored=True)
    row = again["table"].iloc[0]
    assert row["status"] == "finished" and row["rounds"] == 6
    metrics = pd.read_parquet(row["run_dir"] + "/metrics.parquet")
    assert metrics["round"].tolist() == [1, 2, 3, 4, 5, 6]
    # Tune's log of the trial: the rounds the driver relayed before the kill (1, 2, ... as far as
    # its 0.5 s relay had come), then the restored trial's reports, which start after its newest
    # checkpoint (round 2 or 4, by where the kill stopped it); a restart from scratch would report
    # round 1 twice
    log = [
        int(json.loads(line)["round"]) for line in (exp.dir / row["trial_id"] / "result.json").read_text().splitlines()
    ]

    def restored_from(checkpoint):  # the log splits as: relayed 1..k (k >= 1), then checkpoint + 1..6
        before, after = log[: len(log) - (6 - checkpoint)], log[len(log) - (6 - checkpoint) :]
        return (
            after == list(range(checkpoint + 1, 7)) and len(before) >= 1 and before == list(range(1, len(before) + 1))
        )

    assert log.count(1) == 1 and any(restored_from(c) for c in (2, 4) if c <= stopped_at)
    # resumed from its round-2 or round-4 checkpoint, it equals a run that never stopped
    reference = run_local(
        load_experiment(path, ["federation.rounds=6", "federation.checkpoint_every=2"]).base_config, tmp_path / "ref"
    )
    assert row["final_test_accuracy"] == reference["final_test_accuracy"]
    assert (
        metrics["test_accuracy"].tolist()
        == pd.read_parquet(tmp_path / "ref" / "metrics.parquet")["test_accuracy"].tolist()
    )

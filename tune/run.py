"""Ray Tune over federations: one trial = one federation on Ray, reported every evaluated round.

A trial runs `rayfl.api.run` (the coordinator actor and its client actors, as `rayfl run` does;
`ray.num_actors: auto` means the actors it plans for, `Resources.planned`: 1 on CPUs). By default
(`ray.pool_idle_s` > 0) the trials borrow warm actors from the cluster's pool (`actors/keeper.py`)
and hand them back for the next trial, and Tune reuses each trial's own process (`reuse_actors`): a
trial's placement group is one bundle on the head node for the trial's driver (`coordinator_cpus`
CPUs, 0 by default), and `max_concurrent_trials` is cut to the trials whose client actors fit the
cluster at once, so a trial never waits for another's actors. With `ray.pool_idle_s: 0` each trial
starts its own actors inside its placement group: one bundle for the coordinator and one per client
actor, sized exactly to `ray.cpus_per_actor` / `ray.gpus_per_actor`; Tune captures every actor the
trial creates into its group, so concurrent trials never take each other's clients and a trial
starts only when all its bundles fit.

Each trial keeps its RUN_DIR at `<experiment>/<trial_id>/run` (config.yaml, metrics.parquet,
clients.parquet, checkpoints/). A restored experiment (`--resume`, Tune's `Tuner.restore`)
re-runs unfinished trials, which continue from their RUN_DIR's newest checkpoint.

After the search: `results.csv` / `results.parquet` (a row per trial: searched values, final and
best metric, the final per-group values `<metric>@<group>` an algorithm reports (HeteroFL's
levels, InclusiveFL's groups), rounds run, stopped early, status, error, RUN_DIR), `best.yaml` (the
best finished trial's run config, ready for `rayfl run`) and `trials.png` (the metric per trial over rounds).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import yaml
from ray import tune

from actors.driver.cluster import connect
from actors.names import HEAD_RESOURCE
from rayfl import api, checkpoint
from rayfl.config import ConfigError, RunConfig, to_dict
from rayfl.metrics import read_metrics

from .spec import Experiment, trial_config

RUN = "run"
"""A trial's RUN_DIR inside its trial dir."""


def param_space(exp: Experiment) -> dict[str, Any]:
    """Dotted key -> Tune domain."""
    make = {
        "grid": tune.grid_search,
        "choice": tune.choice,
        "uniform": lambda a: tune.uniform(*a),
        "loguniform": lambda a: tune.loguniform(*a),
        "randint": lambda a: tune.randint(*a),
    }
    return {key: make[kind](arg) for key, (kind, arg) in exp.domains.items()}


def bundles(config: RunConfig, coordinator_cpus: float) -> list[dict[str, float]]:
    """The trial's placement group: the coordinator's bundle, then one per client actor; with
    pooled actors (outside any group) only the first, on the head node (a bundle must ask for
    something; this asks for no CPU)."""
    if config.ray.pool_idle_s > 0:
        return [{"CPU": coordinator_cpus, HEAD_RESOURCE: 0.001}]
    resources = config.resources
    return [{"CPU": coordinator_cpus}] + [resources.each for _ in range(resources.planned)]


def concurrent_trials(exp: Experiment, cluster: dict[str, float]) -> int:
    """`max_concurrent_trials`, cut under pooled actors to the trials whose client actors and
    driver (`coordinator_cpus`; the base config's, not searched `ray.*` values) fit the cluster at once."""
    config, most = exp.base_config, exp.spec.max_concurrent_trials
    if config.ray.pool_idle_s == 0:
        return most
    trial = config.resources.need(config.resources.planned)
    trial["CPU"] += exp.spec.coordinator_cpus  # the trial's driver
    fits = [math.floor(cluster.get(key, 0.0) / need + 1e-9) for key, need in trial.items()]
    return max(1, min([most, *fits]))


def trial_dirname(trial: Any) -> str:
    return trial.trial_id


def reported(rows: pd.DataFrame, target: float | None) -> pd.DataFrame:
    """A run's round rows as its trial reports them: the evaluated rounds, with, when a target
    accuracy is set, `time_to_target_s`, the virtual time at which test accuracy first reached it
    (infinite until it does)."""
    rows = rows[rows["test_accuracy"].notna()].copy() if len(rows) else pd.DataFrame(columns=["round", "test_accuracy"])
    if target is not None:
        reached = rows["virtual_time_s"].where(rows["test_accuracy"] >= target)
        rows["time_to_target_s"] = reached.expanding().min().fillna(math.inf)
    return rows


class Reporter:
    """`tune.report`s each evaluated round of the federation (see `reported`). A resumed trial
    starts from its RUN_DIR's rows, so the time to target counts the rounds before the resume."""

    def __init__(self, target: float | None, history: pd.DataFrame | None = None):
        self.target = target
        self.rows: list[dict[str, Any]] = [] if history is None else history.to_dict("records")

    def __call__(self, row: Mapping[str, Any]) -> None:
        self.rows = [r for r in self.rows if r["round"] < row["round"]] + [dict(row)]
        if math.isnan(row["test_accuracy"]):
            return
        last = reported(pd.DataFrame(self.rows), self.target).iloc[-1]
        tune.report({k: np.asarray(v).item() for k, v in last.items() if isinstance(v, (int, float, np.number))})


def run_trial(params: dict[str, Any], base: dict[str, Any], experiment_dir: str, name: str) -> None:
    """The trainable: one federation with the trial's values, on Ray, inside the trial's group."""
    # A trial Tune stops ends at its next round's report, then hands its actors back: on a busy
    # machine that outlasts Tune's 2 s wait before this process takes the next trial (reuse_actors),
    # and the next trial would fail. Read by Tune in this process when it next resets it.
    os.environ["TUNE_FUNCTION_THREAD_TIMEOUT_S"] = "120"
    config = trial_config(base, params)
    config = config.model_copy(update={"ray": config.ray.model_copy(update={"num_actors": config.resources.planned})})
    trial_id = tune.get_context().get_trial_id()
    run_dir = Path(experiment_dir) / trial_id / RUN
    resume = checkpoint.exists(run_dir)
    report = Reporter(config.federation.target_accuracy, read_metrics(run_dir) if resume else None)
    api.run(config, run_dir, progress=report, resume=resume, run_id=f"{name}-{trial_id}")


def trainable(exp: Experiment) -> Any:
    """`run_trial` bound to the experiment, with each trial's placement group from its own config."""
    fn = tune.with_parameters(run_trial, base=exp.base, experiment_dir=str(exp.dir), name=exp.name)
    cpus = exp.spec.coordinator_cpus
    return tune.with_resources(
        fn, lambda params: tune.PlacementGroupFactory(bundles(trial_config(exp.base, params), cpus), strategy="PACK")
    )


def scheduler(exp: Experiment) -> Any:
    if exp.spec.scheduler.name == "none":
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(
        time_attr="round",
        max_t=exp.max_rounds,
        grace_period=exp.grace_period,
        reduction_factor=exp.spec.scheduler.reduction_factor,
    )


def search_alg(exp: Experiment) -> Any:
    if exp.spec.search_alg == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch()
    if exp.spec.search_alg == "hyperopt":
        from ray.tune.search.hyperopt import HyperOptSearch

        return HyperOptSearch()
    return None


def trial_status(exp: Experiment) -> dict[str, str]:
    """Tune's status of each trial (TERMINATED, ERROR, PENDING, ...), read back from the experiment."""
    return {t.trial_id: t.status for t in tune.ExperimentAnalysis(str(exp.dir)).trials}


def searched(exp: Experiment, result: Any) -> dict[str, Any]:
    """A trial's values of the searched keys."""
    return {k: result.config[k] for k in exp.domains}


def trial_history(exp: Experiment, result: Any) -> pd.DataFrame:
    """What a trial reported, rebuilt from its RUN_DIR up to the last round Tune saw (after a
    restore Tune keeps only the reports since the restore; the RUN_DIR holds them all)."""
    run_dir = exp.dir / Path(result.path).name / RUN
    last_round = int((result.metrics or {}).get("round", 0))
    rows = read_metrics(run_dir) if (run_dir / "metrics.parquet").is_file() else pd.DataFrame()
    rows = rows[rows["round"] <= last_round] if len(rows) else rows
    return reported(rows, exp.base_config.federation.target_accuracy)


def results_table(exp: Experiment, trials: list[tuple[Any, pd.DataFrame]]) -> pd.DataFrame:
    """A row per (result, history) trial: searched values, final and best metric, rounds run, and
    its status: `finished` (all rounds), `stopped early` (by the scheduler), `error`, or
    `unfinished` (interrupted: `--resume` continues it)."""
    metric, better = exp.spec.metric, (max if exp.spec.direction == "max" else min)
    tune_status = trial_status(exp)
    rows = []
    for result, history in trials:
        trial_id = Path(result.path).name
        values = searched(exp, result)
        rounds = trial_config(exp.base, values).federation.rounds
        last_round = int(history["round"].iloc[-1]) if len(history) else 0
        if result.error is not None or tune_status.get(trial_id) == "ERROR":
            status = "error"
        elif tune_status.get(trial_id) != "TERMINATED":
            status = "unfinished"
        else:
            status = "finished" if last_round >= rounds else "stopped early"
        rows.append(
            {
                "trial_id": trial_id,
                **values,
                **metric_columns(history, metric, better),
                "rounds": last_round,
                "stopped_early": status == "stopped early",
                "status": status,
                "error": "" if result.error is None else str(result.error).strip().splitlines()[-1],
                "run_dir": str(exp.dir / trial_id / RUN),
            }
        )
    return pd.DataFrame(rows).sort_values("trial_id", ignore_index=True)


def metric_columns(history: pd.DataFrame, metric: str, better) -> dict[str, float]:
    """A trial's final and best metric, and the final value of every per-group column the
    algorithm reports, `<metric>@<group>` (HeteroFL's levels, InclusiveFL's groups); NaN before
    its first round."""
    if not len(history):
        return {f"final_{metric}": math.nan, f"best_{metric}": math.nan}
    groups = [c for c in history.columns if c.startswith(f"{metric}@")]
    return {
        f"final_{metric}": float(history[metric].iloc[-1]),
        f"best_{metric}": float(better(history[metric])),
        **{f"final_{c}": float(history[c].iloc[-1]) for c in groups},
    }


def best_trial(exp: Experiment, table: pd.DataFrame) -> pd.Series | None:
    """The finished trial (all its rounds) with the best final metric."""
    col = f"final_{exp.spec.metric}"
    done = table[(table["status"] == "finished") & table[col].notna()]
    if done.empty:
        return None
    return done.loc[done[col].idxmax() if exp.spec.direction == "max" else done[col].idxmin()]


def plot_trials(exp: Experiment, trials: list[tuple[Any, pd.DataFrame]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for result, history in trials:
        label = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in searched(exp, result).items())
        ax.plot(history["round"], history[exp.spec.metric], marker=".", label=label)
    ax.set_xlabel("round")
    ax.set_ylabel(exp.spec.metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(exp: Experiment, grid: Any) -> dict[str, Any]:
    """results.csv / .parquet, best.yaml and trials.png in the experiment dir; each trial's
    history is read from its RUN_DIR once."""
    trials = [(result, trial_history(exp, result)) for result in grid]
    table = results_table(exp, trials)
    table.to_csv(exp.dir / "results.csv", index=False)
    table.to_parquet(exp.dir / "results.parquet", index=False)
    plot_trials(exp, trials, exp.dir / "trials.png")
    best = best_trial(exp, table)
    out: dict[str, Any] = {"table": table, "best": best}
    if best is not None:
        config = trial_config(exp.base, {k: best[k] for k in exp.domains})
        (exp.dir / "best.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    return out


class TrialBar(tune.Callback):
    """A tqdm bar of trials ended (finished, stopped early or failed), with the best final metric
    of the trials that ran all their rounds so far: the definition of `best_trial`, whose line
    `rayfl tune` prints at the end (a stopped trial's, or a trial's best round, never shows). What
    `rayfl tune` shows instead of Tune's status tables (those come with `--verbose`)."""

    def __init__(self, exp: Experiment, total: int):
        self.metric, self.better = exp.spec.metric, (max if exp.spec.direction == "max" else min)
        self.total, self.rounds, self.bar, self.best = total, exp.max_rounds, None, None
        self.last: dict[str, tuple[Any, Any]] = {}  # trial id -> its last result's (round, metric)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        self.last[trial.trial_id] = result.get("round"), result.get(self.metric)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=self.total, unit="trial", dynamic_ncols=True)
        rounds, value = self.last.get(trial.trial_id, (None, None))
        if rounds == self.rounds and value is not None and not math.isnan(value):
            self.best = value if self.best is None else self.better(self.best, value)
        if self.best is not None:
            self.bar.set_postfix({f"best final {self.metric}": f"{self.best:.4f}"}, refresh=False)
        self.bar.update(1)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.last.pop(trial.trial_id, None)  # a failed trial's last round is not final
        self.on_trial_complete(iteration, trials, trial, **info)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if self.bar is not None:
            self.bar.close()


def num_trials(exp: Experiment) -> int:
    """Trials of the experiment: the grid's points times `num_samples`."""
    return math.prod(len(arg) for kind, arg in exp.domains.values() if kind == "grid") * exp.spec.num_samples


def run_experiment(
    exp: Experiment,
    resume: bool = False,
    address: str | None = None,
    verbose: bool = False,
    callbacks: Sequence[tune.Callback] = (),
) -> dict[str, Any]:
    """Fit (or, with `resume`, restore and finish) the experiment, then write its results. Quiet
    unless `verbose`: a bar of trials, no Tune status tables, no Ray log lines. `callbacks`: Tune
    callbacks of the caller's for a fresh fit, beside the experiment's loggers (a restore runs
    those the fit had again, unpickled). A trial's report waits until Tune has taken it, and under
    `ray.rounds_ahead` the trial's coordinator waits for its reports, so an `on_trial_result`
    acts while the trial's run goes on."""
    if resume and not tune.Tuner.can_restore(str(exp.dir)):
        raise ConfigError(f"--resume: {exp.dir} holds no Tune experiment to restore")
    if not resume and exp.dir.exists():
        raise ConfigError(f"{exp.dir}: exists; pass --resume to continue it, or choose another name")
    if not verbose:  # Tune's legacy reporter prints nothing at verbosity 0 (the new one still prints its header)
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")  # relative paths in configs mean the same as in `rayfl run`
    connected = connect(address or exp.base_config.ray.address, exp.base_config.ray.dashboard, verbose)
    import ray

    try:
        if resume:
            tuner = tune.Tuner.restore(str(exp.dir), trainable(exp), resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable(exp),
                param_space=param_space(exp),
                tune_config=tune.TuneConfig(
                    metric=exp.spec.metric,
                    mode=exp.spec.direction,
                    scheduler=scheduler(exp),
                    search_alg=search_alg(exp),
                    num_samples=exp.spec.num_samples,
                    max_concurrent_trials=concurrent_trials(exp, ray.cluster_resources()),
                    reuse_actors=exp.base_config.ray.pool_idle_s > 0,
                    trial_dirname_creator=trial_dirname,
                ),
                run_config=tune.RunConfig(
                    name=exp.name,
                    storage_path=str(exp.dir.parent),
                    verbose=2 if verbose else 0,
                    callbacks=[
                        *exp.logger_callbacks(),
                        *([] if verbose else [TrialBar(exp, num_trials(exp))]),
                        *callbacks,
                    ],
                ),
            )
        return write_results(exp, tuner.fit())
    finally:
        if connected:
            ray.shutdown()

"""TUNE.yaml: a base run config, the search space over its dotted keys, and how to search.

Everything that can be wrong with a spec is found here, before Ray starts: an unknown key, an
empty grid, a domain that is not one of `grid | choice | uniform | loguniform | randint`, bounds
the wrong way round, a value the run config rejects (each grid / choice value and both ends of a
range are validated against the base config), a metric rayfl does not report, a search
algorithm whose package is missing. Errors are one line naming the key.

    base: ../examples/heterofl/digits.yaml   # a run config file (relative to this file) or a mapping
    search:
      algorithm.levels: {grid: [a1-b1-e1, a2-b8]}
      federation.lr: {loguniform: [0.01, 0.2]}
      devices.mix: {choice: ["1:1:1", "1:2:7"]}
    metric: test_accuracy        # or test_loss, train_loss, mean_wait_s, virtual_time_s, time_to_target_s
    mode: max                    # default: the metric's natural direction
    num_samples: 1               # samples of the non-grid domains (per grid point)
    max_concurrent_trials: 2
    scheduler: {name: asha, grace_period: 1, reduction_factor: 2}   # or none
    search_alg: none             # or optuna, hyperopt (packages installed separately)
    callbacks: {mlflow: {tracking_uri: sqlite:///mlflow.db}}   # or wandb: {...}; beside Tune's own loggers
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from rayfl.config import ConfigError, RunConfig, Strict
from rayfl.config.files import absolute_paths, format_error, read_config, read_yaml, set_values, with_overrides
from rayfl.devices import configured_profile
from rayfl.load import parse_config

log = logging.getLogger("rayfl")

DOMAINS = ("grid", "choice", "uniform", "loguniform", "randint")

METRICS = {
    "test_accuracy": "max",
    "test_loss": "min",
    "train_loss": "min",
    "mean_wait_s": "min",
    "virtual_time_s": "min",
    "time_to_target_s": "min",
}
"""Metrics a trial reports every evaluated round, with their natural mode. `time_to_target_s`
is the virtual time at which the test accuracy first reached `federation.target_accuracy`
(infinite until it does)."""

SEARCH_ALGS = {"optuna": "optuna", "hyperopt": "hyperopt"}
"""search_alg -> the package it needs."""

CALLBACKS = {
    "mlflow": ("ray.air.integrations.mlflow", "MLflowLoggerCallback", "mlflow", "experiment_name"),
    "wandb": ("ray.air.integrations.wandb", "WandbLoggerCallback", "wandb", "project"),
}
"""callbacks key -> Ray's logger callback (module, class), the package it needs, and its option
that names the experiment (default: the Tune experiment's name)."""


def callback_class(name: str) -> type:
    module, attr, _, _ = CALLBACKS[name]
    return getattr(importlib.import_module(module), attr)


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


class Scheduler(Strict):
    name: Literal["asha", "none"] = "none"
    grace_period: int = Field(1, ge=1, description="ASHA: rounds every trial runs before it can be stopped")
    reduction_factor: float = Field(2, gt=1, description="ASHA: keep the best 1/reduction_factor at each rung")


class TuneSpec(Strict):
    base: str | dict[str, Any] = Field(default_factory=dict, description="run config file or mapping")
    search: dict[str, Any] = Field(min_length=1, description="dotted run-config key -> {domain: argument}")
    metric: str = "test_accuracy"
    mode: Literal["max", "min"] | None = None
    num_samples: int = Field(1, ge=1)
    max_concurrent_trials: int = Field(2, ge=1)
    scheduler: Scheduler = Scheduler()
    search_alg: Literal["none", "optuna", "hyperopt"] = "none"
    name: str | None = Field(None, description="experiment name (default: the TUNE file's stem)")
    storage: str = Field("runs/tune", description="folder of experiments; the experiment dir is storage/name")
    coordinator_cpus: float = Field(0.0, ge=0, description="CPUs each trial reserves for its coordinator")
    callbacks: dict[Literal["mlflow", "wandb"], dict[str, Any]] = Field(
        default_factory=dict,
        description="Tune's MLflow / W&B logger callbacks, each with its options (e.g. {mlflow: {tracking_uri: ...}})",
    )

    @model_validator(mode="after")
    def _check(self) -> "TuneSpec":
        if self.metric not in METRICS:
            raise ValueError(f"metric: {self.metric!r} is not one of {', '.join(METRICS)}")
        return self

    @property
    def direction(self) -> str:
        """`mode`, or the metric's natural direction."""
        return self.mode or METRICS[self.metric]


def domain(key: str, spec: Any) -> tuple[str, Any]:
    """`{grid: [..]}` -> ("grid", [..]) after checking its shape; errors name `search.<key>`."""
    where = f"search.{key}"
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in DOMAINS:
        raise ConfigError(f"{where}: write one of {{{' | '.join(f'{d}: ...' for d in DOMAINS)}}}, got {spec!r}")
    kind, arg = next(iter(spec.items()))
    if kind in ("grid", "choice"):
        if not isinstance(arg, list) or not arg:
            raise ConfigError(f"{where}: {kind} needs a non-empty list of values")
        return kind, arg
    if not (
        isinstance(arg, list)
        and len(arg) == 2
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in arg)
    ):
        raise ConfigError(f"{where}: {kind} needs [low, high]")
    low, high = arg
    if not low < high:
        raise ConfigError(f"{where}: {kind} needs low < high, got [{low}, {high}]")
    if kind == "loguniform" and low <= 0:
        raise ConfigError(f"{where}: loguniform needs low > 0, got {low}")
    if kind == "randint" and not (isinstance(low, int) and isinstance(high, int)):
        raise ConfigError(f"{where}: randint needs integer bounds [low, high) , got [{low}, {high}]")
    return kind, arg


def candidates(kind: str, arg: Any) -> list[Any]:
    """The values that stand for a domain when checking it against the config."""
    if kind in ("grid", "choice"):
        return list(arg)
    low, high = arg
    return [low, high - 1] if kind == "randint" else [low, high]


def trial_config(base: dict[str, Any], values: dict[str, Any]) -> RunConfig:
    """The run config of one trial: the base with the searched dotted keys set."""
    return parse_config(set_values(base, values, "search."))


def check_config(config: RunConfig) -> None:
    """What a trial would find wrong before its first round beyond the config's own validation:
    the device profile and its mix."""
    configured_profile(config.devices)


def check_search(base: dict[str, Any], search: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Every domain well formed and every candidate value accepted by the run config (the other
    keys at their first candidate); returns key -> (kind, argument)."""
    domains = {key: domain(key, spec) for key, spec in search.items()}
    first = {key: candidates(*d)[0] for key, d in domains.items()}
    for key, d in domains.items():
        for value in candidates(*d):
            try:
                check_config(trial_config(base, {**first, key: value}))
            except ConfigError as exc:
                raise ConfigError(f"search.{key} = {value!r}: {exc}") from None
    return domains


class Experiment:
    """A checked TUNE.yaml: the spec, the base run config (raw), the domains, where it writes."""

    def __init__(self, spec: TuneSpec, base: dict[str, Any], name: str):
        self.spec = spec
        self.base = base
        self.name = name
        self.domains = check_search(base, spec.search)
        self.base_config = trial_config(base, {k: candidates(*d)[0] for k, d in self.domains.items()})
        self.dir = Path(spec.storage).expanduser().resolve() / name
        kind, arg = self.domains.get("federation.rounds", ("grid", [self.base_config.federation.rounds]))
        self.max_rounds = max(arg) if kind in ("grid", "choice") else arg[1] - 1
        """The most rounds a trial runs (ASHA's `max_t`)."""
        self.grace_period = min(spec.scheduler.grace_period, self.max_rounds)
        """ASHA's grace period, at most `max_rounds` (`--set federation.rounds=5` on a spec whose grace
        period is 10)."""
        if self.grace_period < spec.scheduler.grace_period and spec.scheduler.name == "asha":
            log.info(
                f"scheduler.grace_period: {spec.scheduler.grace_period} > the {self.max_rounds} rounds a trial runs; "
                f"ASHA uses {self.grace_period}"
            )
        if spec.metric == "time_to_target_s" and self.base_config.federation.target_accuracy is None:
            raise ConfigError("metric: time_to_target_s needs federation.target_accuracy in the base config")
        if spec.search_alg != "none":
            package = SEARCH_ALGS[spec.search_alg]
            if not installed(package):
                raise ConfigError(f"search_alg: {spec.search_alg} needs the package {package!r}: pip install {package}")
            grids = [k for k, (kind, _) in self.domains.items() if kind == "grid"]
            if grids:
                raise ConfigError(f"search.{grids[0]}: grid works only with search_alg: none; use choice")
        for name, options in spec.callbacks.items():
            package = CALLBACKS[name][2]
            if not installed(package):
                raise ConfigError(f"callbacks.{name}: needs the package {package!r}: pip install {package}")
            try:
                inspect.signature(callback_class(name)).bind(**options)
            except TypeError as exc:
                raise ConfigError(f"callbacks.{name}: {exc}") from None

    def logger_callbacks(self) -> list[Any]:
        """Tune's logger callbacks of `callbacks`, each naming its experiment after this one
        unless its options do."""
        return [
            callback_class(name)(**{CALLBACKS[name][3]: self.name, **options})
            for name, options in self.spec.callbacks.items()
        ]


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """Read and check TUNE.yaml; `overrides` (`KEY=VALUE`, as `--set`) change the base run config."""
    path = Path(path)
    raw = read_yaml(path)
    try:
        spec = TuneSpec.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {format_error(exc, raw, TuneSpec)}") from None
    here = path.expanduser().resolve().parent
    base = absolute_paths(spec.base, here) if isinstance(spec.base, dict) else read_config(here / spec.base)
    base = with_overrides(base, overrides or [])
    return Experiment(spec, base, spec.name or path.stem)

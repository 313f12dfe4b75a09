"""Loading a run config: YAML file and `--set` overrides -> a validated `RunConfig`.

The schema (the rest of `rayfl.config`) knows no registry; this module does. The model and algorithm
sections are validated by the config class their family or algorithm registers, so each
carries its own keys (`algorithm.mu` for FedProx, `model.rate` for width, ...). When the user
names no model, the algorithm's declared default for the dataset is taken (a split algorithm
on `digits` takes `cnn2`), so `rayfl run --set algorithm.name=X` runs every algorithm as named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Mapping

from pydantic import BaseModel, TypeAdapter, ValidationError

from .algorithms import registry as algorithms
from .algorithms.capabilities import ChecksConfig
from .algorithms.registry import Algorithm
from .config import ConfigError, ModelConfig, RunConfig
from .config.files import format_error, read_config, set_values, with_default_tags, with_overrides
from .data import sources
from .models import registry as models


def _mapping(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The section `name` of a raw config (an absent or empty one as {}); `ConfigError` unless a mapping."""
    section = raw.get(name)
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{name}: expected a mapping, got {type(section).__name__}")
    return section


def _validated(raw: Mapping[str, Any], name: str, cls: type[BaseModel], kind: str) -> BaseModel:
    """The section `name` validated by the class of its family or algorithm, `kind`."""
    section = _mapping(raw, name)
    try:
        return cls.model_validate({**section, "name": kind})
    except ValidationError as exc:
        raise ConfigError(format_error(exc, section, cls, (name,))) from None


def algorithm_of(raw: Mapping[str, Any]) -> Algorithm:
    """The algorithm a raw config names (`fedavg` when it names none): the registry's one lookup
    on a run's path; the parsed config carries it (`config.algorithm.record`)."""
    name = _mapping(raw, "algorithm").get("name", RunConfig.model_fields["algorithm"].default.name)
    try:
        return algorithms.get(name)
    except KeyError as exc:
        raise ConfigError(f"algorithm.name: {exc.args[0]}") from None


def model_family(raw: Mapping[str, Any], algorithm: Algorithm) -> tuple[str, type[BaseModel]]:
    """The model family a config names, and its config class; a config that names none takes the
    algorithm's declared default for the dataset, else the schema's (`cnn`)."""
    data = raw.get("data") if isinstance(raw.get("data"), Mapping) else {}
    dataset = data.get("name", RunConfig.model_fields["data"].default.name)
    kind = _mapping(raw, "model").get("name", algorithm.default_models.get(dataset, ModelConfig().name))
    try:
        return kind, models.config_class(kind)
    except KeyError as exc:
        raise ConfigError(f"model.name: {exc.args[0]}") from None


def with_algorithm_defaults(raw: Mapping[str, Any], algorithm: Algorithm, family: type[BaseModel]) -> dict[str, Any]:
    """`raw` with the algorithm's own `defaults` (its paper's recipe where the engine's defaults do
    not fit it: HeteroFL's static batch norm) for the keys it leaves unset; a model key only where
    the run's model family takes that value."""
    out = dict(raw)
    for key, value in algorithm.defaults.items():
        section, name = key.split(".", 1)
        if name in _mapping(raw, section) or (section == "model" and not takes(family, name, value)):
            continue
        out = set_values(out, {key: value})
    return out


def takes(schema: type[BaseModel], name: str, value: Any) -> bool:
    """Whether the field `name` of `schema` exists and validates `value`."""
    field = schema.model_fields.get(name)
    if field is None:
        return False
    try:
        kind = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
        TypeAdapter(kind).validate_python(value)
    except ValidationError:
        return False
    return True


def with_default_profile(raw: Mapping[str, Any], algorithm: Algorithm) -> dict[str, Any]:
    """`raw` with the algorithm's declared default device profile when the config names neither
    a profile nor a trace (FeDepth takes its memory scenario `fedepth_fair`, not `jetson`, whose
    budgets fit every model)."""
    devices = raw.get("devices", {}) if isinstance(raw.get("devices", {}), Mapping) else None
    declared = algorithm.default_profile
    if declared is None or devices is None or "profile" in devices or devices.get("trace") is not None:
        return dict(raw)
    return {**raw, "devices": {**devices, "profile": declared}}


def algorithm_setting(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What a run takes from its algorithm's own setting (`KEY: value`) because the config leaves it
    unset: its device profile, its model for the dataset and its `defaults` (HeteroFL's static batch
    norm), in that order. `rayfl run` says them in one line: a run that changes what it was not
    told to says so."""
    algorithm = algorithm_of(raw)
    kind, family = model_family(raw, algorithm)
    taken = {}
    if "name" not in _mapping(raw, "model") and kind != ModelConfig().name:
        taken["model.name"] = kind
    filled = with_algorithm_defaults(with_default_profile(raw, algorithm), algorithm, family)
    for section, values in filled.items():
        if isinstance(values, Mapping):
            unset = {name: value for name, value in values.items() if name not in _mapping(raw, section)}
            taken.update({f"{section}.{name}": value for name, value in unset.items()})
    return dict(sorted(taken.items(), key=lambda item: not item[0].startswith("devices.")))


def with_trace_availability(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with a device trace's own availability (`kind: trace`, its online intervals) when the
    config names a trace that has intervals and no availability of its own."""
    devices = raw.get("devices")
    if not isinstance(devices, Mapping) or not isinstance(devices.get("trace"), str) or "availability" in devices:
        return dict(raw)
    if not (Path(devices["trace"]).expanduser() / "intervals.parquet").is_file():
        return dict(raw)
    return {**raw, "devices": {**devices, "availability": {"kind": "trace"}}}


def with_source_partition(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with the data source's own partition kind when it names none (a generated
    federation such as `synthetic` partitions `natural`ly)."""
    data = raw.get("data")
    if not isinstance(data, Mapping):
        return dict(raw)
    src = sources().get(data.get("name", RunConfig.model_fields["data"].default.name))
    part = data.get("partition", {})
    if src is None or not isinstance(part, Mapping) or "kind" in part or src.partition == "dirichlet":
        return dict(raw)
    return {**raw, "data": {**data, "partition": {"kind": src.partition, **part}}}


def parse_config(raw: Mapping[str, Any] | None) -> RunConfig:
    """Validate a raw mapping (from YAML) into a `RunConfig` carrying its algorithm's record
    (`config.algorithm.record`); raise `ConfigError` naming the key."""
    raw = dict(raw or {})
    if not all(isinstance(k, str) for k in raw):
        raise ConfigError("<config>: keys must be strings")
    algorithm = algorithm_of(raw)
    kind, family = model_family(raw, algorithm)
    raw = with_algorithm_defaults(with_trace_availability(with_default_profile(raw, algorithm)), algorithm, family)
    raw = with_default_tags(with_source_partition(raw), RunConfig, RunConfig())
    parsed = {**raw, "model": _validated(raw, "model", family, kind)}
    parsed["algorithm"] = _validated(raw, "algorithm", algorithm.config_class, algorithm.name)
    try:
        config = RunConfig.model_validate(parsed)
    except ValidationError as exc:
        raise ConfigError(format_error(exc, raw, RunConfig)) from None
    algorithm.check_mode(config.federation.mode)
    algorithm.check_population(config.data.num_clients)
    algorithm.check_sums(config.ray.sums, config.federation.mode)
    if issubclass(algorithm.policy, ChecksConfig):  # options it cannot honour
        algorithm.policy.check_config(config)
    return config


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Config file (or the embedded default when None) plus `--set` overrides -> `RunConfig`."""
    raw = read_config(path) if path is not None else {}
    return parse_config(with_overrides(raw, overrides or []))

"""Loading a run config: YAML file and `--set` overrides -> a validated `RunConfig`.

The schema (the rest of `rayfl.config`) knows no registry; this module does. The model and algorithm
sections are validated by the config class their family or algorithm registers, so each
carries its own keys (`algorithm.mu` for FedProx, `model.rate` for width, ...). When the user
names no model, the algorithm's declared default for the dataset is taken (a split algorithm
on `digits` takes `cnn2`), so `rayfl run --set algorithm.name=X` runs every algorithm as named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError

from ..algorithms import registry as algorithms
from ..algorithms.capabilities import ChecksConfig
from ..algorithms.registry import Algorithm
from ..data import sources
from ..models import registry as models
from .base import ConfigError, shown
from .files import format_error, parse_yaml, read_yaml
from .run import ModelConfig, RunConfig


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


def model_section(raw: Mapping[str, Any], algorithm: Algorithm) -> BaseModel:
    """The model section validated by its family's class; a config that names no model takes the
    algorithm's declared default for the dataset, else the schema's (`cnn`)."""
    data = raw.get("data") if isinstance(raw.get("data"), Mapping) else {}
    dataset = data.get("name", RunConfig.model_fields["data"].default.name)
    kind = _mapping(raw, "model").get("name", algorithm.default_models.get(dataset, ModelConfig().name))
    try:
        cls = models.config_class(kind)
    except KeyError as exc:
        raise ConfigError(f"model.name: {exc.args[0]}") from None
    return _validated(raw, "model", cls, kind)


def with_default_tags(raw: Mapping[str, Any], schema: type[BaseModel], default: BaseModel) -> dict[str, Any]:
    """`raw` with the tag of each tagged section it leaves out taken from the default, so one key
    of a section sets alone on top of the defaults (`data.partition.alpha=0.1` keeps `kind:
    dirichlet`); a section naming its own kind is left as it is."""
    out = dict(raw)
    for name, field in schema.model_fields.items():
        value, base = out.get(name), getattr(default, name, None)
        if not isinstance(value, Mapping) or not isinstance(base, BaseModel):
            continue
        if field.discriminator:
            out[name] = {field.discriminator: getattr(base, field.discriminator), **value}
        elif name not in ("model", "algorithm"):  # those two are validated by their registered class
            out[name] = with_default_tags(value, type(base), base)
    return out


def with_default_profile(raw: Mapping[str, Any], algorithm: Algorithm) -> dict[str, Any]:
    """`raw` with the algorithm's declared default device profile when the config names neither
    a profile nor a trace (FeDepth takes its memory scenario `fedepth_fair`, not `jetson`, whose
    budgets fit every model)."""
    devices = raw.get("devices", {}) if isinstance(raw.get("devices", {}), Mapping) else None
    declared = algorithm.default_profile
    if declared is None or devices is None or "profile" in devices or devices.get("trace") is not None:
        return dict(raw)
    return {**raw, "devices": {**devices, "profile": declared}}


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
    raw = with_default_tags(with_source_partition(with_default_profile(raw, algorithm)), RunConfig, RunConfig())
    parsed = {**raw, "model": model_section(raw, algorithm)}
    parsed["algorithm"] = _validated(raw, "algorithm", algorithm.config_class, algorithm.name)
    try:
        config = RunConfig.model_validate(parsed)
    except ValidationError as exc:
        raise ConfigError(format_error(exc, raw, RunConfig)) from None
    algorithm.check_mode(config.federation.mode)
    if issubclass(algorithm.policy, ChecksConfig):  # options it cannot honour
        algorithm.policy.check_config(config)
    return config


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (["a", "b"], yaml_value(c))."""
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected KEY=VALUE")
    key, value = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {text}: empty key")
    return parts, parse_yaml(value, f"--set {shown(key.strip(), 80)}")


def apply_overrides(raw: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted `KEY=VALUE` overrides to a raw mapping (new dicts; the input is untouched)."""
    out: Mapping[str, Any] = raw
    for text in overrides:
        parts, value = parse_override(text)
        out = set_values(out, {".".join(parts): value}, "--set ")
    return _copy(out)


def set_values(raw: Mapping[str, Any], values: Mapping[str, Any], label: str = "") -> dict[str, Any]:
    """Set dotted keys (`federation.lr`) to values in a copy of a raw mapping; errors start with
    `label` and name the key."""
    out: dict[str, Any] = _copy(raw)
    for key, value in values.items():
        parts = key.split(".")
        node = out
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"{label}{key}: {'.'.join(parts[: depth + 1])} is not a mapping")
            node = child
        node[parts[-1]] = value
    return out


def _copy(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in raw.items()}


PATHS = {
    ("data", "data_dir"): True,
    ("model", "init_weights"): True,
    ("devices", "trace"): True,
    ("devices", "profile"): False,
    ("data", "path"): False,
}
"""The config keys that name files or folders: key -> always a path (True), or a path only where
one exists, else a name (a built-in device profile, a Hugging Face hub id)."""


def absolute_paths(raw: Mapping[str, Any], folder: str | Path) -> dict[str, Any]:
    """`raw` with each relative path of `PATHS` made absolute against `folder` (a config file's
    own folder, or the working directory for `--set` values), so a config means the same from
    any working directory and a run's `config.yaml` stores absolute paths."""
    out = _copy(raw)
    for (section, key), always in PATHS.items():
        node = out.get(section)
        value = node.get(key) if isinstance(node, dict) else None
        if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
            continue
        candidate = (Path(folder) / value).resolve()
        if always or candidate.exists():
            node[key] = str(candidate)
    return out


def read_config(path: str | Path) -> dict[str, Any]:
    """A config file's mapping, its relative paths read against the file's folder."""
    return absolute_paths(read_yaml(path), Path(path).expanduser().resolve().parent)


def with_overrides(raw: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`--set` overrides applied, relative paths (given with `--set`) read against the working directory."""
    return absolute_paths(apply_overrides(raw, overrides), Path.cwd())


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Config file (or the embedded default when None) plus `--set` overrides -> `RunConfig`."""
    raw = read_config(path) if path is not None else {}
    return parse_config(with_overrides(raw, overrides or []))

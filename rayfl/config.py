"""Run configuration: YAML -> validated, frozen pydantic models.

The key names follow DESIGN.md's config contract. Unknown keys and wrong types are
errors that name the offending key (`ConfigError`); `--set a.b=c` overrides are applied
to the raw mapping before validation, with YAML-typed values. The model and algorithm
sections are validated by the config class their family or algorithm registers, so
each carries its own keys (`algorithm.mu` for FedProx, `model.rate` for width, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """Bad user input: a one-line message naming the key, file or value at fault."""


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors, instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# ----------------------------------------------------------------------------- data


class IidPartition(Strict):
    """Every client gets an equal-size uniform random share."""

    kind: Literal["iid"] = "iid"


class DirichletPartition(Strict):
    """Label skew from a Dirichlet(alpha) draw.

    Unbalanced (default): each class is split over clients by Dir(alpha * 1_N), so sizes vary.
    Balanced: each client has n/N samples whose label mix is Dir(alpha * q), q the global prior.
    """

    kind: Literal["dirichlet"] = "dirichlet"
    alpha: float = Field(0.5, gt=0, description="concentration alpha; smaller is more skewed")
    balanced: bool = False
    min_size: int = Field(2, ge=0, description="resample until every client holds at least this many")


class ShardsPartition(Strict):
    """HeteroFL's non-iid-k: at most k classes per client, contiguous shards per class."""

    kind: Literal["shards"] = "shards"
    classes_per_client: int = Field(2, ge=1, description="k of non-iid-k")


class NonIidLevelPartition(Strict):
    """MergeSFL's non-IID level p = 1/delta: balanced Dir(delta * q); p = 0 is IID."""

    kind: Literal["noniid_level"] = "noniid_level"
    p: float = Field(0.0, ge=0, description="non-IID level p = 1/delta")


class NaturalPartition(Strict):
    """The dataset's own clients (`synthetic` generates one distribution per client)."""

    kind: Literal["natural"] = "natural"


PartitionConfig = Annotated[
    Union[IidPartition, DirichletPartition, ShardsPartition, NonIidLevelPartition, NaturalPartition],
    Field(discriminator="kind"),
]


class SyntheticConfig(Strict):
    """FedProx's Synthetic(alpha, beta) generator (Li et al., MLSys 2020, Sec. 5.1)."""

    alpha: float = Field(1.0, ge=0, description="spread of the per-client models u_k ~ N(0, alpha)")
    beta: float = Field(1.0, ge=0, description="spread of the per-client inputs B_k ~ N(0, beta)")
    dim: int = Field(60, ge=1)
    num_classes: int = Field(10, ge=2)
    mean_samples: int = Field(100, ge=4, description="mean of the log-normal client sizes")


class DataConfig(Strict):
    name: str = "digits"
    data_dir: Path | None = None
    download: bool = False
    num_clients: int = Field(20, ge=1)
    partition: PartitionConfig = DirichletPartition()
    synthetic: SyntheticConfig = SyntheticConfig()


# ----------------------------------------------------------------------------- model, algorithm


class ModelConfig(Strict):
    """Base of every model family's config; families add their own keys."""

    name: str = "cnn"


class AlgorithmConfig(Strict):
    """Base of every algorithm's config; algorithms add their own keys."""

    name: str = "fedavg"


# ----------------------------------------------------------------------------- federation


class FederationConfig(Strict):
    rounds: int = Field(30, ge=1)
    clients_per_round: int = Field(10, ge=1)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(10, ge=1)
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float | None = Field(None, gt=0, description="clip each step's gradient norm to this (HeteroFL: 1)")
    eval_every: int = Field(1, ge=1, description="evaluate the global model every k rounds (and the last)")
    eval_batch_size: int = Field(500, ge=1)
    checkpoint_every: int = Field(10, ge=0, description="save the server state every k rounds (and the last); 0 never")
    target_accuracy: float | None = Field(None, gt=0, le=1, description="summary.json reports the virtual time to reach it")


class DevicesConfig(Strict):
    profile: str = Field("jetson", description="a built-in profile name or a path to a profile YAML")
    mix: str | None = Field(
        None,
        description="class proportions replacing the profile's, in its class order, e.g. '1:2:7' (weak:medium:strong)",
    )

    @field_validator("mix")
    @classmethod
    def _mix(cls, v: str | None) -> str | None:
        if v is not None:
            mix_shares(v)
        return v


def mix_shares(mix: str) -> list[float]:
    """'1:2:7' -> [1.0, 2.0, 7.0]; ValueError unless non-negative numbers, not all zero."""
    try:
        shares = [float(x) for x in mix.split(":")]
    except ValueError:
        shares = []
    if not shares or any(x < 0 for x in shares) or sum(shares) <= 0:
        raise ValueError(f"write a mix like '1:2:7': non-negative numbers joined by ':', not all zero (got {mix!r})")
    return shares


class RayConfig(Strict):
    address: str | None = None
    num_actors: Literal["auto"] | Annotated[int, Field(ge=1)] = "auto"
    cpus_per_actor: float = Field(1.0, gt=0)
    gpus_per_actor: float = Field(0.0, ge=0)
    dashboard: bool = Field(True, description="start the dashboard (127.0.0.1) with a local cluster")


class RunConfig(Strict):
    seed: int = Field(0, ge=0)
    data: DataConfig = DataConfig()
    model: SerializeAsAny[ModelConfig] = ModelConfig()
    algorithm: SerializeAsAny[AlgorithmConfig] = AlgorithmConfig()
    federation: FederationConfig = FederationConfig()
    devices: DevicesConfig = DevicesConfig()
    clock: Literal["virtual", "emulate"] = "virtual"
    clock_scale: float = Field(1.0, gt=0, description="under clock: emulate, wall seconds per virtual second")
    ray: RayConfig = RayConfig()

    @model_validator(mode="after")
    def _round_fits_population(self) -> "RunConfig":
        if self.federation.clients_per_round > self.data.num_clients:
            raise ValueError(
                f"federation.clients_per_round ({self.federation.clients_per_round}) exceeds "
                f"data.num_clients ({self.data.num_clients})"
            )
        return self


# ----------------------------------------------------------------------------- loading


def _clean_loc(loc: tuple[Any, ...], raw: Any) -> list[str]:
    """The error's location as the user wrote it: tagged-union and type-branch parts dropped."""
    out: list[str] = []
    node = raw
    parts = [str(p) for p in loc]
    for i, part in enumerate(parts):
        if isinstance(node, Mapping) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            out.append(part)
            node = node[int(part)]
        elif isinstance(node, Mapping) and i == len(parts) - 1:  # a missing or unknown key
            out.append(part)
    return out


def format_error(err: ValidationError, raw: Any, prefix: tuple[str, ...] = ()) -> str:
    """One line naming the first offending key, e.g. `federation.lr: Input should be greater than 0`."""
    errors = err.errors()
    first = errors[0]
    loc = _clean_loc(first["loc"], raw)
    if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append(first["ctx"]["discriminator"].strip("'"))
    messages: list[str] = []
    for e in errors:  # the branches of a union fail together at one key: say what each wanted
        if _clean_loc(e["loc"], raw) == _clean_loc(first["loc"], raw):
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
            if msg not in messages:
                messages.append(msg)
    return f"{'.'.join([*prefix, *loc]) or '<config>'}: {' or '.join(messages)}"


def _section(raw: Mapping[str, Any], name: str, lookup) -> BaseModel:
    section = raw.get(name, {})
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{name}: expected a mapping, got {type(section).__name__}")
    kind = section.get("name", RunConfig.model_fields[name].default.name)
    try:
        cls = lookup(kind)
    except KeyError as exc:
        raise ConfigError(f"{name}.name: {exc.args[0]}") from None
    try:
        return cls.model_validate(section)
    except ValidationError as exc:
        raise ConfigError(format_error(exc, section, (name,))) from None


def parse_config(raw: Mapping[str, Any] | None) -> RunConfig:
    """Validate a raw mapping (from YAML) into a `RunConfig`; raise `ConfigError` naming the key."""
    from .algorithms import registry as algorithms
    from .models import registry as models

    raw = dict(raw or {})
    if not all(isinstance(k, str) for k in raw):
        raise ConfigError("<config>: keys must be strings")
    parsed = dict(raw)
    parsed["model"] = _section(raw, "model", models.config_class)
    parsed["algorithm"] = _section(raw, "algorithm", algorithms.config_class)
    try:
        return RunConfig.model_validate(parsed)
    except ValidationError as exc:
        raise ConfigError(format_error(exc, raw)) from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (["a", "b"], yaml_value(c))."""
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected KEY=VALUE")
    key, value = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {text}: empty key")
    try:
        return parts, yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: value is not valid YAML ({exc.__class__.__name__})") from None


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


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with `yaml.safe_load`; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} invalid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Config file (or the embedded default when None) plus `--set` overrides -> `RunConfig`."""
    raw = read_yaml(path) if path is not None else {}
    return parse_config(apply_overrides(raw, overrides or []))


def to_dict(config: RunConfig) -> dict[str, Any]:
    """The resolved config as plain YAML-safe data."""
    return config.model_dump(mode="json")


def dump_config(config: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML; `load_config(path)` gives back an equal object."""
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))

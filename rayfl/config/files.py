"""Config files: YAML read safely, validation errors reported as one line naming the key, and a run's
raw config built from a file and `--set` overrides (paths made absolute, tags defaulted).

`read_yaml` reads configs, device profiles and Tune files; `Loader` also parses `--set`
values; `format_error` turns pydantic's errors into `ConfigError`'s one line (`rayfl/config/base.py`);
`check_known_keys` finds a misspelt key before the registries (and torch) load. Nothing here reads
a registry: `rayfl.load` validates the model and algorithm sections.
"""

from __future__ import annotations

import math
import os
import re
import typing
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ValidationError

from .base import MAX_DEPTH, MAX_YAML_BYTES, MAX_YAML_NODES, ConfigError, closest, shown, shown_key


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


def known_keys(schema: type[BaseModel], parts: list[str]) -> set[str]:
    """The keys the schema accepts at the mapping `parts` leads to (every branch of a union)."""
    models: list[type[BaseModel]] = [schema]
    for part in parts:
        inner = []
        for model in models:
            field = model.model_fields.get(part)
            if field is not None:
                inner += [
                    t
                    for t in (typing.get_args(field.annotation) or (field.annotation,))
                    if isinstance(t, type) and issubclass(t, BaseModel)
                ]
        models = inner
    return {name for model in models for name in model.model_fields}


def format_error(err: ValidationError, raw: Any, schema: type[BaseModel], prefix: tuple[str, ...] = ()) -> str:
    """One line naming the first offending key, e.g. `federation.lr: Input should be greater than 0`;
    an unknown key with the closest known one (`federation.rouns: unknown key (did you mean 'rounds'?)`)."""
    errors = err.errors()
    first = errors[0]
    loc = _clean_loc(first["loc"], raw)
    if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc.append(first["ctx"]["discriminator"].strip("'"))
    where = shown_key(".".join([*prefix, *loc]))
    if first["type"] == "missing" and isinstance(first["input"], list) and isinstance(first["loc"][-1], int):
        short = [e["loc"][-1] for e in errors if e["type"] == "missing" and e["loc"][:-1] == first["loc"][:-1]]
        # a fixed-length list ([low, high]) given too few items, which pydantic calls "Field required"
        given = len(first["input"])
        return f"{where}: {given} item{'' if given == 1 else 's'} given; it takes {max(short) + 1}"
    messages: list[str] = []
    for e in errors:  # the branches of a union fail together at one key: say what each wanted
        if _clean_loc(e["loc"], raw) == _clean_loc(first["loc"], raw):
            msg = e["msg"]
            if e["type"] == "extra_forbidden":
                loc_e = _clean_loc(e["loc"], raw)
                msg = "unknown key" + closest(loc_e[-1], known_keys(schema, loc_e[:-1])) if loc_e else "unknown key"
            if msg not in messages:
                messages.append(msg)
    if first["type"] == "value_error":  # a check of a whole config or section names its keys itself
        msg = first["msg"].removeprefix("Value error, ")
        if not where or msg.startswith(f"{where}."):
            return msg
    return f"{where or '<config>'}: {' or '.join(messages)}"


class Loader(yaml.CSafeLoader):
    """libyaml's safe loader for configs and `--set` values (`parse_yaml` first refuses aliases,
    too many values and deep nesting from the event stream): a key given twice in one mapping is
    an error (the last would win silently), a key must be a plain value (no list or mapping), and a
    ratio like `1:2:7` stays a string (YAML 1.1 reads `1:2` as the base-60 number 62)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a plain value, not a list or mapping", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _scan(text: str) -> None:
    """Read the YAML event stream (libyaml) before anything is built: an alias (`*name`: nested
    aliases expand exponentially, a few hundred bytes would take days), more than
    `MAX_YAML_NODES` values, or nesting deeper than `MAX_DEPTH` raise `yaml.YAMLError`."""
    parser, nodes, depth = yaml.CSafeLoader(text), 0, 0
    try:
        while parser.check_event():
            event = parser.get_event()
            if isinstance(event, yaml.AliasEvent):
                raise yaml.MarkedYAMLError(problem="an alias (*name) is not allowed", problem_mark=event.start_mark)
            if isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
                nodes += 1
                if nodes > MAX_YAML_NODES:
                    raise yaml.MarkedYAMLError(
                        problem=f"more than {MAX_YAML_NODES} values", problem_mark=event.start_mark
                    )
            depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
            if depth > MAX_DEPTH:
                raise yaml.MarkedYAMLError(
                    problem=f"nested more than {MAX_DEPTH} levels deep", problem_mark=event.start_mark
                )
    finally:
        parser.dispose()


Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _digit in "0123456789":  # checked before int and float
    Loader.yaml_implicit_resolvers.setdefault(_digit, []).insert(
        0, ("tag:yaml.org,2002:str", re.compile(r"^[0-9]+(?:\.[0-9]*)?(?::[0-9]+(?:\.[0-9]*)?)+$"))
    )


def parse_yaml(text: str | bytes, where: str) -> Any:
    """YAML text read safely (no tags, no code), refused with one line starting with `where`
    when it is larger than `MAX_YAML_BYTES`, not UTF-8, not valid YAML (the line is named), holds
    an alias, more than `MAX_YAML_NODES` values or nesting deeper than `MAX_DEPTH` (the line is
    named), or holds a number that is not finite (the key is named)."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_YAML_BYTES // 2**20} MB")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    try:
        _scan(text)
        data = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", "") or ""
        if problem == "exceeded maximum nesting depth":  # libyaml's own limit (PyYAML >= 6.0.4), met before our scan's
            problem = f"nested more than {MAX_DEPTH} levels deep"
        ours = ("duplicate key", "a key must", "an alias", "more than", "nested more than")
        said = problem if problem.startswith(ours) else "invalid YAML"
        raise ConfigError(f"{where}:{line} {said}") from None
    except (ValueError, OverflowError) as exc:  # a value YAML recognises but cannot build: 2024-13-01, 5,000 digits
        raise ConfigError(f"{where}: invalid value ({(str(exc).splitlines() or [''])[0][:80]})") from None
    check_values(data, where)
    return data


def check_values(data: Any, where: str, path: tuple[str, ...] = ()) -> None:
    """`ConfigError` at a float that is not finite."""
    if isinstance(data, float) and not math.isfinite(data):
        raise ConfigError(f"{where}: {'.'.join(path) or 'the value'}: {data} is not a finite number")
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        check_values(value, where, (*path, str(key)))


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping safely (`parse_yaml`); errors name the file (and the line and key of
    a key given twice)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    if path.stat().st_size > MAX_YAML_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_YAML_BYTES // 2**20} MB")
    data = parse_yaml(path.read_bytes(), str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


# ----------------------------------------------------------------------------- a run's raw config


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


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=c` -> (["a", "b"], yaml_value(c))."""
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected KEY=VALUE")
    key, value = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {text}: empty key")
    return parts, parse_yaml(value, f"--set {shown_key(key.strip(), 80)}")


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


NAME_MAX = 255
"""Bytes one file or folder name may take (Linux, macOS)."""


def checked_path(value: str | Path, label: str) -> Path:
    """`value` with `~` expanded and symlinks followed, or `ConfigError` starting with `label`: a
    symlink loop, a name longer than `NAME_MAX` bytes, or a path the system cannot look up."""
    path = Path(value).expanduser()
    try:
        resolved = path.resolve()
        long = next((part for part in resolved.parts if len(os.fsencode(part)) > NAME_MAX), None)
        if long is not None:
            raise ConfigError(f"{label}: a name of {len(os.fsencode(long))} bytes; at most {NAME_MAX}")
        resolved.exists()  # raises for what resolve() lets pass: a path too long in all
    except RuntimeError:  # Python 3.11's resolve() on a loop
        raise ConfigError(f"{label}: {shown(str(path), 120)}: a symlink loop") from None
    except OSError as exc:
        raise ConfigError(f"{label}: {shown(str(path), 120)}: {exc.strerror or type(exc).__name__}") from None
    return resolved


def absolute_paths(raw: Mapping[str, Any], folder: str | Path) -> dict[str, Any]:
    """`raw` with each relative path of `PATHS` made absolute against `folder` (a config file's
    own folder, or the working directory for `--set` values), so a config means the same from
    any working directory and a run's `config.yaml` stores absolute paths; a path that cannot
    be looked up (`checked_path`) is refused naming its key."""
    out = _copy(raw)
    for (section, key), always in PATHS.items():
        node = out.get(section)
        value = node.get(key) if isinstance(node, dict) else None
        if not isinstance(value, str) or not value:
            continue
        candidate = checked_path(Path(folder) / value, f"{section}.{key}")  # an absolute value: itself
        if not Path(value).expanduser().is_absolute() and (always or candidate.exists()):
            node[key] = str(candidate)
    return out


def read_config(path: str | Path) -> dict[str, Any]:
    """A config file's mapping, its relative paths read against the file's folder."""
    return absolute_paths(read_yaml(path), Path(path).expanduser().resolve().parent)


def with_overrides(raw: Mapping[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`--set` overrides applied, relative paths (given with `--set`) read against the working directory."""
    return absolute_paths(apply_overrides(raw, overrides), Path.cwd())


EARLY = ("model", "algorithm")
"""Sections whose keys only their family's or algorithm's class knows (`rayfl.load`)."""


def check_known_keys(raw: Mapping[str, Any]) -> None:
    """`ConfigError` naming the first unknown key of a raw config outside the model and algorithm
    sections and the data partition (whose kind a data source may choose): the keys a typo most
    often hits, found before the registries, and torch with them, load. The whole config is
    validated after (`rayfl.load.parse_config`), so no other error is reported here."""
    from .run import RunConfig

    rest = with_default_tags({k: v for k, v in raw.items() if k not in EARLY}, RunConfig, RunConfig())
    try:
        RunConfig.model_validate(rest)
    except ValidationError as exc:
        unknown = [
            e
            for e in exc.errors()
            if e["type"] == "extra_forbidden" and tuple(map(str, e["loc"][:2])) != ("data", "partition")
        ]
        if unknown:
            loc = _clean_loc(unknown[0]["loc"], rest)
            raise ConfigError(
                f"{shown_key('.'.join(loc))}: unknown key{closest(loc[-1], known_keys(RunConfig, loc[:-1]))}"
            ) from None

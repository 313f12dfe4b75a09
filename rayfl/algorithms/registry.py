"""Algorithms by name: each registers one `Algorithm` record (its summary, config class, server
policy and client procedure) when its module is imported.

The built-in algorithms are the modules of `rayfl.algorithms`, every one imported with the
package. Algorithms of other packages plug in through the entry point group `rayfl.algorithms`
(`PLUGINS`): each entry names a module that registers its algorithm(s) when imported, the way
pytest and flake8 find their plugins; they are imported the first time the registry is asked.

A config parsed by `rayfl.load.parse_config` carries its algorithm's record
(`config.algorithm.record`, set here on the config class), so a run asks the registry once.
`rayfl list` reads the built-in summaries without importing torch from `rayfl/catalog_builtin.py`,
which `python -m rayfl.algorithms` writes from the records (with the datasets' and model families').
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, get_args

from .. import catalog
from ..catalog import PLUGINS
from ..config import MAX_CLIENTS, WHOLE_POPULATION, AlgorithmConfig, ConfigError
from .base import ClientProcedure, ServerPolicy

SYNC_ONLY = "its aggregation waits for every selected client, and rayfl has no rule for its stale or missing updates"


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    """One line: what `rayfl list` shows."""
    config_class: type[AlgorithmConfig]
    policy: type[ServerPolicy]
    procedure: type[ClientProcedure]
    default_models: Mapping[str, str] = field(default_factory=dict)
    """Dataset name -> the model family this algorithm takes when the config names none."""
    default_profile: str | None = None
    """The built-in device profile this algorithm takes when the config names none (nor a trace):
    one whose budgets exercise its heterogeneity (FeDepth's memory scenario), as `default_models`."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Config values (`section.key`) the algorithm takes where the config leaves them unset: its
    paper's recipe where the engine's defaults do not fit it (HeteroFL's static batch norm); a
    `model.` key applies to the model families that have it."""
    short_runs: tuple[int, str] | None = None
    """(N, what to know): `rayfl run` says it before a run of at most N rounds (E-FedSup's Big
    sub-net sits near chance for its first 20-40 rounds, and which setting learns)."""
    vectorizable: bool = False
    """Opt-in: the procedure trains `ray.vectorize` clients of one variant in one batched call
    (`run_vectorized`, `vectorize.train_vectorized` over the procedure's own loss)."""
    sync_only: str | None = SYNC_ONLY
    """Why the algorithm runs in synchronous rounds only (`federation.mode: sync`), or None when
    it runs in every mode: its policy aggregates updates rebased onto the current model
    (`rayfl.algorithms.staleness`), each a leading block of the global tensors."""

    over_every_client: str | None = None
    """What the algorithm computes over every client of the population (HeteroFL's "label histogram,
    levels, per-client evaluation"), or None: it touches only the clients a round
    draws, so a population of up to `MAX_CLIENTS` is drawn lazily (FedAvg's keyed draws). With a
    reason, `data.num_clients` is bounded by `max_clients` (`check_population`)."""
    max_clients: int = WHOLE_POPULATION

    def check_population(self, num_clients: int) -> None:
        """`ConfigError` naming `data.num_clients` when this algorithm computes over every client and
        the population exceeds its `max_clients`: refused before the run, rather than a setup or
        rounds whose time and memory grow with the population."""
        if self.over_every_client and num_clients > self.max_clients:
            raise ConfigError(
                f"data.num_clients: {self.name} works over every client ({self.over_every_client}): at most "
                f"{self.max_clients}, not {num_clients} (fedavg draws clients lazily, up to {MAX_CLIENTS:.0e})"
            )

    def check_mode(self, mode: str) -> None:
        """`ConfigError` naming `federation.mode` when the algorithm cannot run in `mode`."""
        if mode != "sync" and self.sync_only:
            raise ConfigError(
                f"federation.mode: {self.name} runs in synchronous rounds only, not {mode}: {self.sync_only}"
            )

    def check_sums(self, where: str, mode: str) -> None:
        """`ConfigError` naming `ray.sums` when `device` asks for a sum on the device where the
        clients' updates are not summed where they train: a policy that needs each update whole,
        or a server that takes updates as they arrive."""
        if where != "device":
            return
        if not callable(getattr(self.policy, "summand", None)):
            raise ConfigError(
                f"ray.sums: device: {self.name}'s aggregate is not a sum of its clients' updates (it needs each one "
                "whole); use auto"
            )
        if mode != "sync":
            raise ConfigError(
                f"ray.sums: device: under federation.mode {mode} the server takes each update whole as it arrives; "
                "use auto"
            )


_ALGORITHMS: dict[str, Algorithm] = {}
_PLUGINS_LOADED: list[bool] = []


def register(algorithm: Algorithm) -> Algorithm:
    """Add `algorithm` under its name and tie its config class to it (`AlgorithmConfig.record`):
    a name is registered once, a config class serves one algorithm and defaults `name` to it."""
    cls = algorithm.config_class
    if algorithm.name in _ALGORITHMS:
        raise ValueError(f"algorithm {algorithm.name!r} registered twice")
    if cls.model_fields["name"].default != algorithm.name:
        raise ValueError(f"algorithm {algorithm.name!r}: {cls.__name__}.name must default to {algorithm.name!r}")
    if cls.__dict__.get("record") is not None:
        raise ValueError(f"algorithm {algorithm.name!r}: {cls.__name__} serves {cls.record.name!r}; subclass it")
    if hasattr(algorithm.policy, "sums"):
        raise ValueError(
            f"algorithm {algorithm.name!r}: {algorithm.policy.__name__}.sums is not read; a policy whose aggregate is "
            "a sum defines `summand` (set `summand = None` to opt out of an inherited one)"
        )
    if algorithm.vectorizable and not hasattr(algorithm.procedure, "run_vectorized"):
        raise ValueError(
            f"algorithm {algorithm.name!r}: vectorizable, but {algorithm.procedure.__name__} has no run_vectorized"
        )
    cls.record = algorithm
    _ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def plugins() -> list[metadata.EntryPoint]:
    """The installed entry points of the group `rayfl.algorithms` (none: an empty list)."""
    return list(metadata.entry_points(group=PLUGINS))


def _load_plugins() -> None:
    """Import every plugin module (each registers its algorithms), once they all imported;
    `ConfigError` naming the entry point whose module fails to import, every time it is asked."""
    if _PLUGINS_LOADED:
        return
    for entry in plugins():
        try:
            entry.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is named, not a traceback
            raise ConfigError(
                f"entry point {entry.name} = {entry.value} ({PLUGINS}): {type(exc).__name__}: {exc}"
            ) from None
    _PLUGINS_LOADED.append(True)


def algorithms() -> dict[str, Algorithm]:
    """Every registered algorithm, the plugins' included."""
    _load_plugins()
    return dict(_ALGORITHMS)


def get(name: str) -> Algorithm:
    """The algorithm `name` (plugins are imported only for a name that the modules imported so
    far did not register); `KeyError` saying which names exist (and the closest one)."""
    if name not in _ALGORITHMS:
        _load_plugins()
    if name not in _ALGORITHMS:
        raise KeyError(catalog.unknown("algorithm", name, _ALGORITHMS))
    return _ALGORITHMS[name]


LISTING = Path(__file__).resolve().parent.parent / "catalog_builtin.py"


def builtin() -> dict[str, Algorithm]:
    """The algorithms of `rayfl.algorithms` (by where their config class is defined), by name."""
    here = __package__ + "."
    return {n: a for n, a in sorted(_ALGORITHMS.items()) if a.config_class.__module__.startswith(here)}


def listing() -> str:
    """The text of `rayfl/catalog_builtin.py`: the one-line summaries of rayfl's own datasets,
    model families and algorithms, from their registrations (each table sorted by name)."""
    from ..data import sources
    from ..models import families

    own = lambda fn: fn.__module__.split(".")[0] == "rayfl"
    tables = {
        "DATASETS": {name: s.summary for name, s in sorted(sources().items()) if own(s.load)},
        "MODELS": {name: f.summary for name, f in sorted(families().items()) if own(f.build)},
        "ALGORITHMS": {name: a.summary for name, a in builtin().items()},
    }
    text = (
        '"""The one-line summaries of rayfl\'s own datasets, model families and algorithms, written by\n'
        "`python -m rayfl.algorithms` from their registrations, so `rayfl list` shows them without\n"
        'importing torch; tests/test_usersday.py fails when it is stale."""\n'
    )
    for name, table in tables.items():
        rows = "".join(_row(key, summary) for key, summary in table.items())
        text += f"\n{name} = {{\n{rows}}}\n"
    return text


PAGE = Path(__file__).resolve().parents[2] / "docs" / "algorithms.md"
"""The algorithms page of a checkout (absent from an installed package), whose table `table` writes."""
TABLE_MARKS = (
    "<!-- the table below is written by `python -m rayfl.algorithms` -->",
    "<!-- end of the written table -->",
)


def table() -> str:
    """The table of `docs/algorithms.md`: each built-in algorithm, the keys its config adds to
    `algorithm.*` (a key with one allowed value, such as FedAdam's `kind`, is its identity, not a
    setting), and its summary."""
    rows = ["| name | keys (`algorithm.*`) | what |", "|---|---|---|"]
    for name, a in builtin().items():
        keys = [k for k, f in a.config_class.model_fields.items() if k != "name" and len(get_args(f.annotation)) != 1]
        rows.append(f"| `{name}` | {', '.join(f'`{k}`' for k in keys) or '-'} | {a.summary} |")
    return "\n".join(rows) + "\n"


def with_table(page: str) -> str:
    """`page` with its table between `TABLE_MARKS` written anew."""
    start, end = TABLE_MARKS
    head, rest = page.split(start + "\n", 1)
    tail = rest.split(end + "\n", 1)[1]
    return f"{head}{start}\n{table()}{end}\n{tail}"


def _row(key: str, summary: str, width: int = 120) -> str:
    """`    "key": "summary",` with the summary cut at spaces into literals that fit `width`."""
    line, rows = f"    {json.dumps(key)}: ", []
    words = summary.split(" ")
    while words:
        part = words.pop(0)
        while words and len(line) + len(json.dumps(f"{part} {words[0]} ")) + 1 <= width:
            part += " " + words.pop(0)
        rows.append(line + json.dumps(part + (" " if words else "")))
        line = "    "
    return "\n".join(rows) + ",\n"

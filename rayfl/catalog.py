"""What rayfl offers, by name and one line each, readable without importing torch: the
source of `rayfl list` and of the "did you mean" suggestions for a misspelt name.

Every dataset, model family and algorithm carries its one-line summary in its registration;
rayfl's own are copied to `rayfl/catalog_builtin.py` (`python -m rayfl.algorithms`), and
`tests/test_usersday.py` fails when that copy is stale. A built-in device profile is a YAML file
in `rayfl/devices/profiles/`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml

from .catalog_builtin import ALGORITHMS, DATASETS, MODELS

PLUGINS = "rayfl.algorithms"
"""The entry point group of algorithms defined outside rayfl: `name = module`, the module
registering its algorithm(s) when imported (`rayfl.algorithms.registry`)."""

__all__ = ["ALGORITHMS", "PLUGINS", "DATASETS", "MODELS", "profile_files", "profiles", "unknown"]


def profile_files() -> dict[str, Path]:
    """Built-in device profiles: name -> its YAML file in `rayfl/devices/profiles/`."""
    folder = resources.files("rayfl") / "devices" / "profiles"  # not rayfl.devices: its package imports torch
    return {
        p.name.removesuffix(".yaml"): Path(str(p))
        for p in sorted(folder.iterdir(), key=lambda p: p.name)
        if p.name.endswith(".yaml")
    }


def profiles() -> dict[str, dict[str, Any]]:
    """Built-in device profiles: name -> the raw YAML mapping (validated when a run loads it)."""
    return {name: yaml.safe_load(path.read_text()) for name, path in profile_files().items()}


KNOWN_SHOWN = 160
"""The most characters of known names an error lists; past it, the count left and `rayfl list`."""


def unknown(kind: str, name: str, known: Iterable[str]) -> str:
    """`unknown KIND 'name' (did you mean 'x'?) (known: a, b, ...)`: whole names only, in order,
    as many as fit in `KNOWN_SHOWN` characters, then how many more `rayfl list` shows (a line
    that a printer cuts at its width would cut a name in two)."""
    from .config.base import closest, shown

    names = sorted(known)
    listed: list[str] = []
    while len(listed) < len(names) and len(", ".join([*listed, names[len(listed)]])) <= KNOWN_SHOWN:
        listed.append(names[len(listed)])
    more = f", and {len(names) - len(listed)} more: rayfl list" if len(listed) < len(names) else ""
    return f"unknown {kind} {shown(repr(name), 80)}{closest(name, names)} (known: {', '.join(listed)}{more})"

"""The base of every config section, the error bad input raises (`rayfl.config` re-exports
both), the bounds on counts that would exhaust memory, and how a message shows what it echoes."""

import difflib
import unicodedata
from typing import Iterable

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """Bad user input: a one-line message naming the key, file or value at fault."""


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors, instances are frozen, and a float
    must be finite (`.inf` and `.nan` are refused wherever a number is read)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


MAX_ROUNDS = 1_000_000
"""`federation.rounds` at most: per-round tables (the lr schedule) stay a few megabytes."""
MAX_CLIENTS = 1_000_000_000
"""`data.num_clients` at most (logical clients are drawn lazily)."""
WHOLE_POPULATION = 10_000
"""`data.num_clients` at most for an algorithm that computes over every client at setup or each
round (`rayfl.algorithms.registry.Algorithm.over_every_client`), so its time and memory stay bounded."""
MAX_PER_ROUND = 100_000
"""Clients a round selects (or keeps in flight) at most."""
MAX_ACTORS = 10_000
"""`ray.num_actors` at most."""
MAX_YAML_BYTES = 1024 * 1024
"""A config, device profile or Tune file larger than this is refused before it is parsed."""
MAX_YAML_NODES = 50_000
"""Values (scalars, lists and mappings) one YAML file holds at most: with `MAX_YAML_BYTES`, what
bounds the time to parse and validate any accepted file (under 2 s; `bench/yaml_limits.py`)."""
MAX_DEPTH = 64
"""Mappings and lists nested deeper than this are refused."""
MAX_SHOWN = 300
"""Characters of a message line shown at most; the middle of a longer line is cut."""


def shown(text: str, limit: int = MAX_SHOWN) -> str:
    """`text` fit to print on one line: control, format (bidi overrides, zero-width) and line
    separator characters escaped as `\\uXXXX`, and the middle of a line longer than `limit`
    replaced by `...(N characters)...`."""
    safe = "".join(
        f"\\u{ord(c):04x}" if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn") else c for c in text
    )
    if len(safe) <= limit:
        return safe
    keep = (limit - 30) // 2
    return f"{safe[:keep]}...({len(safe) - 2 * keep} characters)...{safe[-keep:]}"


def closest(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the known name closest to a misspelt one, else ``."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def shown_key(key: str, limit: int = MAX_SHOWN) -> str:
    """A config key as a message shows it: `shown`, with every non-ASCII character escaped
    (`\\u0435`), so a look-alike (a Cyrillic `е` in `fеderation`) is seen for what it is."""
    return shown(key.encode("ascii", "backslashreplace").decode("ascii"), limit)

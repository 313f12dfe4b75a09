"""The dataclasses a checkpoint may hold (`rayfl/checkpoint.py`): each registered where it is
defined, with `@state_type` (rayfl's own server state, the engine's schedulers and batteries, and
any policy's own). Registration is an import: the engine's and every built-in algorithm's types
are registered once `rayfl.engine` is imported, a plugin's once its module is, as its policy's
is before a resume. `STATE_TYPES` is the allow-list `checkpoint.decode` builds from; any other
name in a file makes the file unreadable."""

from __future__ import annotations

import dataclasses

STATE_TYPES: dict[str, type] = {}
"""`module:qualname` -> the registered dataclass."""


def state_name(cls: type) -> str:
    """The name a checkpoint file gives a state dataclass: `module:qualname`."""
    return f"{cls.__module__}:{cls.__qualname__}"


def state_type(cls: type) -> type:
    """Class decorator: `cls`, a dataclass, allowed in checkpoints."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{state_name(cls)} is not a dataclass")
    STATE_TYPES[state_name(cls)] = cls
    return cls

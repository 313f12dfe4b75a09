"""Model families by name: each has a config class (its keys) and a builder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from .. import catalog
from ..config import ModelConfig

Builder = Callable[[ModelConfig, tuple[int, ...], int], nn.Module]


@dataclass(frozen=True)
class ModelFamily:
    name: str
    config_class: type[ModelConfig]
    build: Builder
    summary: str
    """One line for `rayfl list` (the built-ins' copied to `rayfl/catalog_builtin.py`)."""


_FAMILIES: dict[str, ModelFamily] = {}


def register(name: str, config_class: type[ModelConfig], summary: str) -> Callable[[Builder], Builder]:
    """Decorator: register `build(config, input_shape, num_classes) -> nn.Module` under `name`,
    with its one-line `summary`."""

    def wrap(build: Builder) -> Builder:
        if name in _FAMILIES:
            raise ValueError(f"model family {name!r} registered twice")
        _FAMILIES[name] = ModelFamily(name, config_class, build, summary)
        return build

    return wrap


def families() -> dict[str, ModelFamily]:
    return dict(_FAMILIES)


def config_class(name: str) -> type[ModelConfig]:
    if name not in _FAMILIES:
        raise KeyError(catalog.unknown("model", name, _FAMILIES))
    return _FAMILIES[name].config_class


def build_model(config: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Instantiate the family's module for one input shape (without batch) and class count."""
    return _FAMILIES[config.name].build(config, tuple(input_shape), num_classes)

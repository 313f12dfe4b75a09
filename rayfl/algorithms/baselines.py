"""The baselines the width and depth papers compare against, declared once for both families.

HeteroFL (Diao et al., ICLR 2021, Tables 1-3) and InclusiveFL (Liu et al., KDD 2022, Table 2)
compare with the same three ways of ignoring device heterogeneity: AllLarge (every client
trains the largest model, whatever its device), AllSmall (every client trains the smallest, so
every device fits) and ExclusiveFL (only the devices that fit the largest model train).
`register_baselines` declares the three on one family's machinery (its config, policy and
procedure); the family says which of its config fields each baseline pins.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from pydantic import create_model

from ..config import AlgorithmConfig
from .base import ClientProcedure, ServerPolicy
from .registry import Algorithm, register

KINDS = {
    "alllarge": ("AllLarge", "every client trains the largest model, ignoring memory budgets"),
    "allsmall": ("AllSmall", "every client trains the smallest model, so every device fits"),
    "exclusivefl": ("ExclusiveFL", "only the clients whose device fits the largest model train"),
}


def register_baselines(
    family: type[AlgorithmConfig],
    suffix: str,
    pins: Mapping[str, Mapping[str, tuple[Any, Any]]],
    policy: type[ServerPolicy],
    procedure: type[ClientProcedure],
    exclusive_profile: str | None = None,
    **options: Any,
) -> dict[str, Algorithm]:
    """AllLarge, AllSmall and ExclusiveFL of one family, registered as `<kind><suffix>`: each a
    config class derived from `family` with the fields `pins[kind]` set (name -> (type, default),
    pydantic's `create_model`), the family's policy and procedure, and `options` (the
    registration's default models, vectorizable); ExclusiveFL takes `exclusive_profile` as its default device
    profile where the family's own default leaves every device able to train the largest model. Each class is an attribute of the family's
    module (`AllLargeConfig`, `AllLargeDepthConfig`, ...), so a config pickles by reference."""
    module = sys.modules[family.__module__]
    out = {}
    for kind, (title, what) in KINDS.items():
        name = f"{kind}{suffix}"
        class_name = f"{title}{suffix.title().replace('_', '')}Config"
        config = create_model(
            class_name,
            __base__=family,
            __module__=module.__name__,
            __doc__=f"{title}: {what}.",
            name=(str, name),
            **pins[kind],
        )
        setattr(module, class_name, config)
        profile = {"default_profile": exclusive_profile} if kind == "exclusivefl" and exclusive_profile else {}
        out[kind] = register(Algorithm(name, config, policy, procedure, **profile, **options))
    return out

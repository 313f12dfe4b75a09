"""HeteroFL's levels (Sec. 3.1): width rates a..e, a mix's proportions, and how clients are dealt
a level (`fix`, `capability`, `budget`; `match_depths`' rates of equal parameter counts)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...config import ConfigError, RunConfig
from ...models import build_model
from ...models.layers import DepthConfig
from ..messages import FederationContext

RATES = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.125, "e": 0.0625}


_MIX = re.compile(r"^[a-e]\d+(-[a-e]\d+)*$")


@dataclass(frozen=True)
class Level:
    name: str
    rate: float
    proportion: int


def parse_levels(mix: str) -> list[Level]:
    """`a1-b1-e2` -> levels a, b, e with proportions 1, 1, 2 (the global model is the first)."""
    return [Level(tok[0], RATES[tok[0]], int(tok[1:])) for tok in mix.split("-")]


def matched_levels(levels: Sequence[Level], config: RunConfig, context: FederationContext) -> list[Level]:
    """The levels with the width rates whose models have the parameter counts of the depth-cut
    models (`match_depths`, largest depth first): the global level keeps rate 1 at the largest
    depth; each other rate sits on the side of the step, where params(rate) jumps past
    params(depth) (bisection to 1e-4), whose count is nearer."""
    from scipy import optimize  # lazily: most runs never match depths

    depths = sorted((int(d) for d in config.algorithm.match_depths.split("-")), reverse=True)
    if not isinstance(config.model, DepthConfig):
        raise ConfigError(f"algorithm.match_depths: model {config.model.name} has no depth to match")
    if len(depths) != len(levels) or depths[0] != config.model.depth:
        raise ConfigError(
            f"algorithm.match_depths: one depth per level ({len(levels)}), the largest model.depth "
            f"({config.model.depth})"
        )
    params = lambda **change: sum(
        p.numel()
        for p in build_model(
            config.model.model_copy(update=change), context.input_shape, context.num_classes
        ).parameters()
    )
    rates = [1.0]
    for depth in depths[1:]:
        target = params(depth=depth)
        step = optimize.bisect(lambda r: params(rate=r) - target, 1e-3, 1.0, xtol=1e-4)
        rates.append(min((step - 2e-4, step + 2e-4), key=lambda r: abs(params(rate=r) - target)))
    return [Level(level.name, rate, level.proportion) for level, rate in zip(levels, rates)]


def budget_levels(rates: np.ndarray) -> tuple[list[Level], np.ndarray]:
    """Levels from each client's widest fitting width rate (`budget.client_rates`), widest first,
    named by rate, with the full width as the global level (proportion 0 when nobody fits it);
    and each client's level (-1 for a rate of 0: nothing fits)."""
    distinct = sorted({float(r) for r in rates if r > 0}, reverse=True)
    if distinct[0] < 1.0:
        distinct.insert(0, 1.0)
    levels = [Level(f"{r:.3g}", r, int((rates == r).sum())) for r in distinct]
    return levels, np.array([distinct.index(float(r)) if r > 0 else -1 for r in rates])


def assign_fix(levels: Sequence[Level], num_clients: int) -> np.ndarray:
    """Public code `fix`: level k repeated q * p_k times in order, q = floor(N / sum p); the rest get the last."""
    q = num_clients // sum(l.proportion for l in levels)
    out = np.concatenate([np.full(q * l.proportion, k) for k, l in enumerate(levels)]).astype(int)
    return np.concatenate([out, np.full(num_clients - len(out), len(levels) - 1)]).astype(int)


def assign_capability(levels: Sequence[Level], memory_needed: Sequence[float], budgets: np.ndarray) -> np.ndarray:
    """The widest level whose training memory fits each client's budget; -1 when none fits."""
    order = sorted(range(len(levels)), key=lambda k: -levels[k].rate)
    out = np.full(len(budgets), -1)
    for c, budget in enumerate(budgets):
        out[c] = next((k for k in order if memory_needed[k] <= budget), -1)
    return out

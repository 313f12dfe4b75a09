"""Memory budgets as model sizes: the widest width rate that fits each client's budget (width
methods under FeDepth's budget scenarios: HeteroFL, SplitMix, FedAvg at the smallest width)."""

from __future__ import annotations

import numpy as np

from ..config import ModelConfig, RunConfig
from .messages import FederationContext

RATE_TOL = 1e-4


def fitting_rate(
    config: RunConfig, context: FederationContext, budget: float, model: ModelConfig | None = None
) -> float:
    """The largest width rate in (0, 1] whose training memory (`FederationContext.training_memory`)
    fits `budget` bytes, by bisection to `RATE_TOL`; 0 when not even the thinnest fits."""
    model = model or config.model
    need = lambda r: context.training_memory(model.model_copy(update={"rate": r}))
    if need(1.0) <= budget:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > RATE_TOL:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if need(mid) <= budget else (lo, mid)
    return lo


def client_rates(config: RunConfig, context: FederationContext, model: ModelConfig | None = None) -> np.ndarray:
    """(num_clients,) each client's width rate, once per device class: a `memory_width` budget r
    gives r itself (capped at 1: it is that width's measured memory), a `memory_mb` budget its
    `fitting_rate`."""
    classes = context.classes("the width of each client")
    per_class = [
        min(c.memory_width, 1.0)
        if c.memory_width is not None
        else fitting_rate(config, context, c.memory_mb * 2**20, model)
        for c in classes
    ]
    return np.array(per_class)[context.device_classes]

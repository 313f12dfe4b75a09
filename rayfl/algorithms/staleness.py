"""Stale updates: how an update trained from an older model enters the server's aggregate.

FedAsync (Xie, Koyejo, Gupta, "Asynchronous Federated Optimization", 2019, arXiv:1903.03934),
Alg. 1: the server holding x_{t-1} receives x_new, trained from x_tau, and mixes it in,

    x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new,    alpha_t = alpha s(t - tau),

with s (Sec. 5.2) constant (1), polynomial ((t - tau + 1)^-a) or hinge (1 for t - tau <= b,
else 1 / (a (t - tau - b) + 1)).

FedBuff (Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba, "Federated Learning with
Buffered Asynchronous Aggregation", AISTATS 2022, arXiv:2106.06639), Alg. 1: a client sends
Delta_i = y_Q - y_0, its change from the model it downloaded; the server adds each, scaled by
s = 1 / sqrt(1 + staleness) (Sec. 6: the polynomial s with a = 0.5), to a buffer, and after K
updates steps its optimizer with the buffer's mean, x <- x + eta_g (1/K) sum_i s_i Delta_i.

rayfl's staleness of an update is the number of server steps between the client's download
and the update's arrival (0: nothing changed meanwhile), and it reads FedAsync's t - tau as
that number: t is the version the server holds when the update arrives. (Alg. 1 numbers the
version being computed, so its t - tau is one more: a fresh update has weight alpha here, alpha
s(1) there.) `as_current` turns an arrival into a result trained from the current model, so the
policy's own `aggregate` (its weighting, its server optimizer: FedAvg's `server_lr` is FedBuff's
eta_g, FedAdam's is its adaptive step) applies unchanged.
"""

from __future__ import annotations

from typing import Collection

from ..config import FederationConfig, StalenessConfig
from ..types import Weights
from . import aggregate
from .messages import ClientResult


def weight(staleness: int, cfg: StalenessConfig) -> float:
    """s(t - tau) for an update `staleness` versions old (Xie et al. 2019, Sec. 5.2)."""
    if cfg.kind == "constant":
        return 1.0
    if cfg.kind == "polynomial":
        return float((staleness + 1) ** -cfg.a)
    return 1.0 if staleness <= cfg.b else 1.0 / (cfg.a * (staleness - cfg.b) + 1.0)


def as_current(
    result: ClientResult,
    start: Weights,
    current: Weights,
    staleness: int,
    federation: FederationConfig,
    params: Collection[str],
) -> ClientResult:
    """The update as the policy's `aggregate` takes it, trained from `current`:

    - FedAsync (`mode: async`, `rule: fedasync`): the mixed model, (1 - alpha_t) x + alpha_t x_new;
      aggregated alone, with FedAvg's server step at eta = 1 it is x_t itself.
    - FedBuff (`mode: async`, `rule: fedbuff`): x + s Delta for the `params`, each update of
      weight 1, so the buffer's mean is x + (1/K) sum s_i Delta_i (Alg. 1), whatever the
      clients' sizes; buffers (batch-norm statistics) average the clients' own values.
    - a late update carried into a later deadline round: x + s Delta, keeping its weight (n_k
      for FedAvg) among the round's fresh updates.
    """
    s = weight(staleness, federation.staleness)
    if federation.mode == "async" and federation.asynchronous.rule == "fedasync":
        return result.replace(weights=aggregate.mix(current, result.weights, federation.asynchronous.mixing * s))
    moved = result.replace(weights=aggregate.rebase(current, start, result.weights, s, params))
    return moved.replace(num_examples=1) if federation.mode == "async" else moved

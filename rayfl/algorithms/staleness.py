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
s(1) there.) Each rule below turns an arrival into a result trained from the current model, so
the policy's own `aggregate` (its weighting, its server optimizer: FedAvg's `server_lr` is
FedBuff's eta_g, FedAdam's is its adaptive step) applies unchanged. Which rule applies is the
scheduler's to say: FedAsync's and FedBuff's are the asynchronous server's (`engine/asynchronous.py`),
a carried late update the deadline server's (`engine/deadline.py`).
"""

from __future__ import annotations

from typing import Collection

from ..config import StalenessConfig
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


def fedasync(
    result: ClientResult, current: Weights, staleness: int, cfg: StalenessConfig, alpha: float
) -> ClientResult:
    """FedAsync (Alg. 1): the mixed model, (1 - alpha_t) x + alpha_t x_new, alpha_t = alpha s(t - tau);
    aggregated alone, with FedAvg's server step at eta = 1 it is x_t itself."""
    return result.replace(weights=aggregate.mix(current, result.weights, alpha * weight(staleness, cfg)))


def fedbuff(
    result: ClientResult,
    start: Weights,
    current: Weights,
    staleness: int,
    cfg: StalenessConfig,
    params: Collection[str],
) -> ClientResult:
    """FedBuff (Alg. 1): x + s Delta for the `params`, each update of weight 1, so the buffer's mean
    is x + (1/K) sum s_i Delta_i, whatever the clients' sizes; buffers (batch-norm statistics)
    average the clients' own values."""
    return carried(result, start, current, staleness, cfg, params).replace(num_examples=1)


def carried(
    result: ClientResult,
    start: Weights,
    current: Weights,
    staleness: int,
    cfg: StalenessConfig,
    params: Collection[str],
) -> ClientResult:
    """A late update carried into a later deadline round: x + s Delta, keeping its weight (n_k for
    FedAvg) among the round's fresh updates."""
    s = weight(staleness, cfg)
    return result.replace(weights=aggregate.rebase(current, start, result.weights, s, params))

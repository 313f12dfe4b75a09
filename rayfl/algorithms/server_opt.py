"""Functional server optimizers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021).

Two calls: `init(kind, params, ...)` gives a state holding the hyperparameters, and
`apply(state, params, delta)` returns the new state and parameters, where delta is the
aggregated pseudo-gradient Delta_t = sum_k w_k (x_k - x_t). FedAvg is `sgd` with eta = 1
and no momentum (x_{t+1} = x_t + Delta_t); FedAvgM adds server momentum.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Mapping

import numpy as np

from ..statetypes import state_type

Kind = Literal["sgd", "adam", "yogi", "adagrad"]
Arrays = Mapping[str, np.ndarray]


@state_type
@dataclass(frozen=True)
class ServerOptState:
    kind: Kind
    eta: float
    """Server learning rate eta."""
    beta1: float = 0.9
    """First-moment decay beta_1 (server momentum for sgd)."""
    beta2: float = 0.99
    tau: float = 1e-3
    """Adaptivity tau (the epsilon of Alg. 2)."""
    m: Mapping[str, np.ndarray] | None = None
    v: Mapping[str, np.ndarray] | None = None
    t: int = 0


def init(
    kind: Kind, params: Arrays, eta: float, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3
) -> ServerOptState:
    """m_{-1} = 0 and v_{-1} = tau^2 (Reddi et al. Alg. 2 requires v_{-1} >= tau^2)."""
    zeros = {k: np.zeros(np.shape(v), np.float64) for k, v in params.items()}
    v0 = {k: np.full(np.shape(v), tau**2, np.float64) for k, v in params.items()} if kind != "sgd" else None
    return ServerOptState(kind, eta, beta1, beta2, tau, zeros, v0, 0)


def second_moment(kind: Kind, v: np.ndarray, d2: np.ndarray, beta2: float) -> np.ndarray:
    """Alg. 2: Adagrad v + D^2; Yogi v - (1-b2) D^2 sign(v - D^2); Adam b2 v + (1-b2) D^2."""
    if kind == "adagrad":
        return v + d2
    if kind == "yogi":
        return v - (1 - beta2) * d2 * np.sign(v - d2)
    if kind == "adam":
        return beta2 * v + (1 - beta2) * d2
    raise ValueError(f"no second moment for {kind!r}")


def apply(state: ServerOptState, params: Arrays, delta: Arrays) -> tuple[ServerOptState, dict[str, np.ndarray]]:
    """One server step over the keys of `delta`; returns (new state, new params in float64).

    sgd:     m_t = beta1 m_{t-1} + Delta_t;            x_{t+1} = x_t + eta m_t
    adaptive m_t = beta1 m_{t-1} + (1-beta1) Delta_t;  x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)
    """
    m_new, v_new, x_new = {}, {}, {}
    for k, d in delta.items():
        x = np.asarray(params[k], np.float64)
        if state.kind == "sgd":
            m = state.beta1 * state.m[k] + d if state.beta1 else d
            x_new[k] = x + state.eta * m
        else:
            m = state.beta1 * state.m[k] + (1 - state.beta1) * d
            v = second_moment(state.kind, state.v[k], d * d, state.beta2)
            v_new[k] = v
            x_new[k] = x + state.eta * m / (np.sqrt(v) + state.tau)
        m_new[k] = m
    new_state = dataclasses.replace(state, m=m_new, v=v_new if state.kind != "sgd" else None, t=state.t + 1)
    return new_state, x_new

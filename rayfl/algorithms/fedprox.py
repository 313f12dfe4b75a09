"""FedProx: "Federated Optimization in Heterogeneous Networks", Li, Sahu, Zaheer, Sanjabi,
Talwalkar, Smith, MLSys 2020 (arXiv:1812.06127).

The server is FedAvg's. Each client minimises h_k(w; w^t) = F_k(w) + (mu/2) ||w - w^t||^2
(Eq. 2), the proximal term keeping local models near the global one.
"""

from __future__ import annotations

from typing import Mapping

import torch
from pydantic import Field

from .fedavg import FedAvgClient, FedAvgConfig, FedAvgPolicy
from .registry import Algorithm, register


class FedProxConfig(FedAvgConfig):
    name: str = "fedprox"
    mu: float = Field(0.01, ge=0, description="proximal weight mu of Eq. 2")


def squared_distance(
    params: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor], batched: bool = False
) -> torch.Tensor:
    """||w - w^t||^2 over every parameter: a scalar, or (K,) for K clients' stacked parameters
    (`batched`: each tensor's first dimension is the client)."""
    return sum(((p - anchor[n]) ** 2).flatten(int(batched)).sum(-1) for n, p in params.items())


class FedProxClient(FedAvgClient):
    """FedAvg's local training on h_k (Eq. 2): the cross-entropy plus the proximal term."""

    def penalty(
        self, params: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor], *, batched: bool
    ) -> torch.Tensor:
        """Eq. 2's proximal term (mu / 2) ||w - w^t||^2 (per client when `batched`)."""
        return self.config.algorithm.mu / 2 * squared_distance(params, anchor, batched)


FEDPROX = register(
    Algorithm(
        "fedprox",
        "FedProx (Li et al. 2020): FedAvg with a proximal term mu",
        FedProxConfig,
        FedAvgPolicy,
        FedProxClient,
        vectorizable=True,
        sync_only=None,
    )
)

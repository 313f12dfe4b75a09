"""FedProx: "Federated Optimization in Heterogeneous Networks", Li, Sahu, Zaheer, Sanjabi,
Talwalkar, Smith, MLSys 2020 (arXiv:1812.06127).

The server is FedAvg's. Each client minimises h_k(w; w^t) = F_k(w) + (mu/2) ||w - w^t||^2
(Eq. 2), the proximal term keeping local models near the global one.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from .base import ClientTask, LocalState
from .fedavg import FedAvgClient, FedAvgConfig, FedAvgPolicy
from .registry import Algorithm, register


class FedProxConfig(FedAvgConfig):
    name: str = "fedprox"
    mu: float = Field(0.01, ge=0, description="proximal weight mu of Eq. 2")


class FedProxClient(FedAvgClient):
    def init(self, task: ClientTask, model: nn.Module) -> LocalState:
        state = super().init(task, model)
        state.extras = [p.detach().clone() for p in model.parameters()]  # w^t
        return state

    def penalty(self, params: dict[str, torch.Tensor], initial: dict[str, torch.Tensor]) -> torch.Tensor:
        """Eq. 2's proximal term for K stacked clients: (mu / 2) ||w_k - w^t||^2 each."""
        return self.config.algorithm.mu / 2 * sum(((p - initial[n]) ** 2).flatten(1).sum(1) for n, p in params.items())

    def loss(self, state: LocalState, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Eq. 2: F_k(w) + (mu / 2) ||w - w^t||^2."""
        prox = sum(((p - p0) ** 2).sum() for p, p0 in zip(state.model.parameters(), state.extras))
        return super().loss(state, logits, y) + self.config.algorithm.mu / 2 * prox


FEDPROX = register(Algorithm("fedprox", "FedProx (Li et al. 2020): FedAvg with a proximal term mu", FedProxConfig, FedAvgPolicy, FedProxClient))

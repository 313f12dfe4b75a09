"""FedOpt: FedAdam, FedYogi, FedAdagrad from "Adaptive Federated Optimization", Reddi, Charles,
Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, ICLR 2021 (arXiv:2003.00295).

Clients run FedAvg's local SGD; the server applies an adaptive optimizer to the averaged
pseudo-gradient Delta_t (Alg. 2, see `server_opt.apply`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..config import AlgorithmConfig
from ..types import Weights
from . import server_opt
from .fedavg import FedAvgClient, FedAvgPolicy
from .registry import Algorithm, register


class FedOptConfig(AlgorithmConfig):
    name: Literal["fedadam"] = "fedadam"
    kind: Literal["adam"] = Field(
        "adam", description="the server optimizer: adam, yogi or adagrad, set by the algorithm's name"
    )
    server_lr: float = Field(0.01, gt=0, description="server learning rate eta")
    beta1: float = Field(0.9, ge=0, lt=1, description="first-moment decay beta_1")
    beta2: float = Field(0.99, ge=0, lt=1, description="second-moment decay beta_2 (Adam, Yogi)")
    tau: float = Field(1e-3, gt=0, description="adaptivity tau")


class FedOptPolicy(FedAvgPolicy):
    def opt_init(self, params: Weights) -> server_opt.ServerOptState:
        cfg = self.config.algorithm
        return server_opt.init(cfg.kind, params, eta=cfg.server_lr, beta1=cfg.beta1, beta2=cfg.beta2, tau=cfg.tau)


class FedYogiConfig(FedOptConfig):
    name: Literal["fedyogi"] = "fedyogi"
    kind: Literal["yogi"] = Field("yogi", description="the server optimizer, set by the algorithm's name")


class FedAdagradConfig(FedOptConfig):
    name: Literal["fedadagrad"] = "fedadagrad"
    kind: Literal["adagrad"] = Field("adagrad", description="the server optimizer, set by the algorithm's name")


for _cfg, _summary in (
    (FedOptConfig, "FedAdam (Reddi et al. 2021): adaptive server optimizer"),
    (FedYogiConfig, "FedYogi (Reddi et al. 2021): adaptive server optimizer"),
    (FedAdagradConfig, "FedAdagrad (Reddi et al. 2021): adaptive server optimizer"),
):
    register(
        Algorithm(
            _cfg.model_fields["name"].default,
            _summary,
            _cfg,
            FedOptPolicy,
            FedAvgClient,
            vectorizable=True,
            sync_only=None,
        )
    )

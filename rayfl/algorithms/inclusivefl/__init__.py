"""InclusiveFL: "No One Left Behind: Inclusive Federated Learning over Heterogeneous Devices",
Ruixuan Liu, Fangzhao Wu, Chuhan Wu, Yanlin Wang, Lingjuan Lyu, Hong Chen, Xing Xie, KDD 2022
(arXiv:2202.08036), Algorithm 1.

Clients are dealt to depth groups by device class (the profile's classes in order, weakest
first, so `devices.mix` is the paper's device proportion): group j trains a model of depth L_j
(`algorithm.depths`, e.g. 2-4-6) whose first L_j - 1 layers and stem are the bottom of the
largest model, and whose top layer L_j and head f_j are its own. Per round (l. 8-29):

- homomorphic aggregation: within a group, the clients' updates are averaged (FedAvg, l. 14:
  `group_weighting: samples`, or per user as printed: `users`) into g^j;
- momentum distillation (l. 15-23): the smaller group's top-layer update becomes
  beta m^k_{t-1} + (1 - beta) g^{j,L_j}, where m^k is the mean of the next larger group k's
  updates over its layers L_j .. L_k of the round before (matched by name relative to the layer,
  initialised to 0); `beta: 0` is InclusiveFL without MD;
- each group's sub-global model takes a server step (l. 19): FedAdam (Reddi et al.) with its own
  moments and, optionally, the paper's per-group rates (`server_lrs`), or plain FedAvg;
- layer-wise heterogeneous aggregation (l. 26-28): each shared layer is the average over the
  groups holding it not as their top layer, weighted by each group's share of the round's
  samples (users with `group_weighting: users`); each group's top layer and head stay its own.

The public code's momentum distillation is a no-op through three bugs (docs/papers.md,
InclusiveFL: public code, momentum distillation): it assigns instead of accumulating over the
layers, keeps a reference to gradients that are then zeroed, and blends only while the momentum
is still the integer 0. This module implements the paper's intent: accumulated, copied, applied
every round. The code also takes one server step per type from pooled gradients (FedSGD);
rayfl's clients run local epochs (Algorithm 1, l. 12).

The package: `config` (the groups' settings and the baselines'), `policy` (the server); this
module registers InclusiveFL and its baselines.
"""

from ..fedavg import FedAvgClient
from ..registry import Algorithm, register
from .config import (
    DEPTH_MODELS,
    AllLargeDepthConfig,
    AllSmallDepthConfig,
    DepthBaselineConfig,
    DepthGroupsConfig,
    ExclusiveFLDepthConfig,
    InclusiveFLConfig,
    parse_depths,
)
from .policy import Group, GroupState, InclusiveFLPolicy, distill, heterogeneous, momentum_of, sharers

for _config, _summary in (
    (InclusiveFLConfig, "InclusiveFL (Liu et al. 2022): depth groups, layer-wise aggregation, momentum distillation"),
    (AllLargeDepthConfig, "AllLarge (InclusiveFL baseline): FedAdam on the largest depth, every client"),
    (AllSmallDepthConfig, "AllSmall (InclusiveFL baseline): FedAdam on the smallest depth, every client"),
    (ExclusiveFLDepthConfig, "ExclusiveFL (InclusiveFL baseline): FedAdam on the largest depth, strongest class only"),
):
    _name = _config.model_fields["name"].default
    register(
        Algorithm(
            _name,
            _summary,
            _config,
            InclusiveFLPolicy,
            FedAvgClient,
            DEPTH_MODELS,
            vectorizable=True,
            over_every_client="depth groups, the clients a round may draw",
        )
    )

__all__ = [
    "DEPTH_MODELS",
    "AllLargeDepthConfig",
    "AllSmallDepthConfig",
    "DepthBaselineConfig",
    "DepthGroupsConfig",
    "ExclusiveFLDepthConfig",
    "Group",
    "GroupState",
    "InclusiveFLConfig",
    "InclusiveFLPolicy",
    "distill",
    "heterogeneous",
    "momentum_of",
    "parse_depths",
    "sharers",
]

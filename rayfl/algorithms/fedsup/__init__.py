"""FedSup and E-FedSup: "Supernet Training for Federated Image Classification under System
Heterogeneity", Taehyeon Kim, Se-Young Yun (arXiv:2206.01366), Algorithm 1, on the supernet of
`rayfl.models.supernet` (Table 5).

- FedSup: the server broadcasts the whole supernet; per local iteration a client trains M
  sub-nets (`subnets`) on the same batch, with the sandwich rule (the largest and the smallest
  always among them when M >= 3) and in-place distillation (Eq. 6-7: the largest learns from the
  labels, the others from its detached soft predictions), gradients accumulated then one step
  (Alg. 1 l. 7-11). Every client's supernet is averaged by its sample share (l. 13).
- E-FedSup (Sec. 3.4): clients in tiers by device class (weakest first); each receives one sub-net
  drawn uniformly until its FLOPs fit its tier's budget (FLOPs-aware, as the paper; `budget:
  params` as the public code), only that sub-net travels, and it trains with cross-entropy.
  Aggregation fills what a client did not train with the broadcast values (Sec. 3.5, the paper:
  `aggregation: fill`) or averages each entry over the clients holding it (`count`).
- Evaluation: the Big, Medium and Small children (`test_accuracy@big`, ...; `test_accuracy` is
  Big's) and, with `federation.personalize_epochs`, Big's initial and personalized accuracy
  (head fine-tuned per client).

The public code's published runs switch the sandwich rule, in-place distillation and FLOPs-aware
tiers off (M = 1, plain CE, parameter budgets) and its "max" draws a random sub-net
(docs/papers.md, FedSup: public code, tiers and sub-net sampling; FedSup: public code, sandwich
rule and distillation): `subnets: 1`, `inplace_distill: false` and `budget: params` give those
choices.

The package: `config`, `costs` (any sub-net's FLOPs and parameters), `policy` (the server's
side, both methods), `client` (FedSup's local iterations; E-FedSup's clients train as FedAvg's);
this module registers both.
"""

from ..fedavg import FedAvgClient
from ..registry import Algorithm, register
from .client import FedSupClient, FedSupTask, distill_loss, step_subnets
from .config import EFedSupConfig, FedSupConfig
from .costs import SubnetCost, SubnetCosts
from .policy import EFedSupPolicy, FedSupPolicy, fill_finish

SUPERNET_MODELS = {
    "digits": "supernet_small",
    "mnist1d": "supernet_small",
    "cifar10": "supernet",
    "cifar100": "supernet",
}

FEDSUP = register(
    Algorithm(
        "fedsup",
        "FedSup (Kim & Yun 2023): supernet broadcast, sandwich-sampled sub-nets with in-place distillation per step",
        FedSupConfig,
        FedSupPolicy,
        FedSupClient,
        SUPERNET_MODELS,
    )
)
EFEDSUP = register(
    Algorithm(
        "efedsup",
        "E-FedSup (Kim & Yun 2023): one FLOPs-fitting sub-net per client by tier, only the sub-net travels",
        EFedSupConfig,
        EFedSupPolicy,
        FedAvgClient,
        SUPERNET_MODELS,
        short_runs=(
            40,
            "random sub-nets trained on labels alone keep its Big sub-net near chance for its first 20-40 rounds "
            "(docs/fedsup.md); its paper's setting learns in 200: rayfl run examples/fedsup/efedsup.yaml",
        ),
        vectorizable=True,
    )
)

__all__ = [
    "EFEDSUP",
    "FEDSUP",
    "SUPERNET_MODELS",
    "EFedSupConfig",
    "EFedSupPolicy",
    "FedSupClient",
    "FedSupConfig",
    "FedSupPolicy",
    "FedSupTask",
    "SubnetCost",
    "SubnetCosts",
    "distill_loss",
    "fill_finish",
    "step_subnets",
]

"""HeteroFL: "HeteroFL: Computation and Communication Efficient Federated Learning for
Heterogeneous Clients", Enmao Diao, Jie Ding, Vahid Tarokh, ICLR 2021 (arXiv:2010.01264).

Clients train nested width slices of one global model: level p keeps the first ceil(r_p C)
channels of every hidden layer (Sec. 3.1, `aggregate.extract`), and the server averages every
entry over the clients that hold it (Sec. 3.1: `aggregate.count_sum` per client, added up,
then `count_finish`), classifier rows only over the clients whose label split has the class.
The Scaler divides by the rate relative to the global model in training (Sec. 3.2); static BN
keeps no running statistics in training and recomputes them before evaluation (Sec. 3.2).
Clients mask absent classes in the cross-entropy (Sec. 3.2, "masking trick").

Where the paper and its public code differ, this follows the paper and offers the code's
behaviour as options: the code fills masked logits with 0 (`mask: zero`, the default, as the
code; `-inf` removes absent classes from the softmax entirely) and calibrates sBN over the
whole training set (`sbn_clients: 1.0`; a fraction samples that share of clients per evaluation).
Levels: a=1, b=1/2, c=1/4, d=1/8, e=1/16; a mix `a1-b1-e1` gives proportions; the first letter
is the global model. `fix` deals levels to clients in index blocks once; `dynamic` re-draws every
client's level each round; `capability` gives each client the widest level of the mix whose
training memory fits its device's budget (clients that fit none never take part); `class` deals
levels by device class, the strongest class the first level (one level per class); `budget`
replaces the letters by the widest width rate each client's memory fits (FeDepth's budget
scenarios: a `memory_width` budget r gives width r, so HeteroFL and FeDepth meet the same devices).

`match_depths` (InclusiveFL's HeteroFL baseline, Liu et al. 2022 Sec. 4.1) replaces the letters'
rates by the width rates at which the model has the parameter count of the same family cut to
each depth (largest first, e.g. `2-4-6` for levels a, b, c of a 6-layer model), so the width and
depth methods compare at equal model sizes per device class.

The package: `levels` (Sec. 3.1's rates and how clients get them), `config`, `policy` (the
server, static BN), `client` (the masked loss); this module registers HeteroFL and its baselines.
"""

from ..registry import Algorithm, register
from .client import HeteroFLClient
from .config import AllLargeConfig, AllSmallConfig, ExclusiveFLConfig, HeteroFLConfig
from .levels import RATES, Level, assign_capability, assign_fix, budget_levels, matched_levels, parse_levels
from .policy import HeteroFLPolicy, HeteroFLTask, masked_logits, static_bn

RECIPE = {"model.norm": "sbn"}
"""Sec. 3.2's static batch norm, the default of every model family with a norm: running statistics
tracked in training would mix sub-models of different widths (with them the global model stays at
chance on the default data, 0.10 after 20 rounds, against 0.95 with static BN)."""

OVER_EVERY_CLIENT = "label histogram, levels, per-client evaluation"

HETEROFL = register(
    Algorithm(
        "heterofl",
        "HeteroFL (Diao et al. 2021): nested width sub-models, per-entry aggregation",
        HeteroFLConfig,
        HeteroFLPolicy,
        HeteroFLClient,
        defaults=RECIPE,
        vectorizable=True,
        sync_only=None,
        over_every_client=OVER_EVERY_CLIENT,
    )
)

for _name, _summary, _config, _profile in (
    ("alllarge", "AllLarge: FedAvg at full width on every client (HeteroFL baseline)", AllLargeConfig, None),
    ("allsmall", "AllSmall: FedAvg at the smallest level on every client (HeteroFL baseline)", AllSmallConfig, None),
    # memory budgets of 1/6 to 1 of the width: some devices cannot train full width
    (
        "exclusivefl",
        "ExclusiveFL: FedAvg at full width on the clients that fit it (HeteroFL baseline)",
        ExclusiveFLConfig,
        "fedepth_fair",
    ),
):
    register(
        Algorithm(
            _name,
            _summary,
            _config,
            HeteroFLPolicy,
            HeteroFLClient,
            default_profile=_profile,
            defaults=RECIPE,
            vectorizable=True,
            sync_only=None,
            over_every_client=OVER_EVERY_CLIENT,
        )
    )

__all__ = [
    "HETEROFL",
    "RECIPE",
    "RATES",
    "AllLargeConfig",
    "AllSmallConfig",
    "ExclusiveFLConfig",
    "HeteroFLClient",
    "HeteroFLConfig",
    "HeteroFLPolicy",
    "HeteroFLTask",
    "Level",
    "assign_capability",
    "assign_fix",
    "budget_levels",
    "masked_logits",
    "matched_levels",
    "parse_levels",
    "static_bn",
]

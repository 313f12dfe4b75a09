"""FeDepth and m-FeDepth: "Memory-adaptive Depth-wise Heterogeneous Federated Learning",
Kai Zhang, Yutong Dai, Hongyi Wang, Eric Xing, Xun Chen, Lichao Sun (arXiv:2303.04887),
Algorithm 1, with the public code's PreResNet-20 (`rayfl.models.preresnet20`).

Every client trains the full-size model, block by block within its memory budget:
- memory-adaptive decomposition: what training each layer costs is measured once per model
  variant (`measure_layers`: saved-tensor hooks for the activations kept for backward,
  parameters, gradients and optimizer state), and the layers are cut greedily into the fewest
  consecutive blocks whose training fits the client's budget (`decompose`, the paper's Fig. 3),
  next to the weights of the whole model and the head's training, which every stage holds;
- depth-wise sequential learning (problem (1)): stage j trains block j and the head on the
  output of the frozen blocks before it, from the global body and the head as stage j - 1 left
  it, for the task's local epochs (the code's `max_iter` per stage); each stage has a fresh
  optimizer over only its trainable parameters, so frozen blocks never move (`frozen_drift`: the
  public code under PyTorch 1.7, whose zeroed-not-freed gradients let momentum and weight decay
  move earlier blocks); FeDepth reaches the head through the parameter-free skip link
  (`preresnet20.link`), m-FeDepth through the auxiliary classifier after the block's last layer;
- the frozen prefix's outputs are computed once per stage and cached when the budget allows
  them beside the stage's training (the paper's remark), else recomputed per batch
  (`cache_prefix`); the virtual clock counts what each stage runs (`client_cost`);
- partial training: a client whose budget cannot hold some early layer alone skips the first
  layers (the stem feeds the first kept layer through the link; the code's `link3`) and never
  trains them; the public code's group-1 bug (skipped forward with the six-stage trainable set)
  is not reproduced;
- aggregation (Alg. 1 l. 9): each tensor is the sample-weighted mean over the clients that
  trained it, so m-FeDepth's auxiliary heads average over only the clients whose blocks ended at
  them (the code's "balance weights" are unbiased only in expectation) and partial clients leave
  their skipped layers to the others;
- mutual knowledge distillation (Sec. "Exploit Sufficient Memory"): a client whose budget holds
  M >= 2 full trainings trains the global model and M - 1 peers jointly, each on
  CE + lambda / (M - 1) sum KL(peer || self) with the peers' logits detached (Deep Mutual
  Learning, as the code; the paper's printed objective scales CE by 1/M), and uploads only the
  global one. Each client's peers persist in the server's client state from round to round
  (the code shares one by accident: `peers: shared`), initialised from the initial global model.
"""

from ..registry import Algorithm, register
from .client import FeDepthClient, Stage, mkd_loss
from .memory import decompose, measure_layers, plan
from .policy import FEDEPTH_MODELS, FeDepthConfig, FeDepthPolicy, FeDepthTask, MFeDepthConfig, MFeDepthPolicy

OVER_EVERY_CLIENT = "memory budgets, the depth-wise plan each fits"

FEDEPTH = register(
    Algorithm(
        "fedepth",
        "FeDepth (Zhang et al. 2023): memory-adaptive depth-wise training of the full model, skip links to the head",
        FeDepthConfig,
        FeDepthPolicy,
        FeDepthClient,
        FEDEPTH_MODELS,
        default_profile="fedepth_fair",
        over_every_client=OVER_EVERY_CLIENT,
    )
)
MOVER_EVERY_CLIENT = "memory budgets, the depth-wise plan each fits"

FEDEPTH = register(
    Algorithm(
        "mfedepth",
        "m-FeDepth (Zhang et al. 2023): depth-wise training with auxiliary classifiers per block",
        MFeDepthConfig,
        MFeDepthPolicy,
        FeDepthClient,
        FEDEPTH_MODELS,
        default_profile="fedepth_fair",
        over_every_client=OVER_EVERY_CLIENT,
    )
)

__all__ = [
    "FEDEPTH",
    "FEDEPTH_MODELS",
    "FeDepthClient",
    "FeDepthPolicy",
    "FeDepthTask",
    "MFEDEPTH",
    "MFeDepthPolicy",
    "decompose",
    "measure_layers",
    "mkd_loss",
    "plan",
    "Stage",
]

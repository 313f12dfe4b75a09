"""DepthFL: "DepthFL: Depthwise Federated Learning for Heterogeneous Clients", Minjae Kim,
Sangyoon Yu, Suhyun Kim, Soo-Mook Moon, ICLR 2023 (OpenReview pf8RIZTMU58), as FeDepth's paper
(Zhang et al., arXiv:2303.04887) runs it "to conform to our predefined memory budgets", on
FeDepth's PreResNet-20 (`rayfl.models.preresnet20`). The first author's Flower baseline
(`baselines/depthfl`; docs/papers.md, DepthFL: public code, Flower baseline) is the reference
for what the paper leaves open.

- Depth scaling: the global model has classifiers at its exits, the layers with an auxiliary
  classifier (`model.aux_heads`, "3-6" when the config names none: the ends of the three
  stages, like DepthFL's stage classifiers) and the last layer. A client trains the deepest
  prefix ending at an exit whose training memory fits its budget (`fitting_depth`); clients that
  fit none sit out. The prefix of depth d is the model at `depth: d`, whose head stands for the
  global `aux.<d-1>` (`global_name`); only the prefix's tensors travel down and up.
- Local objective: mutual self-distillation among the prefix's K classifiers
  (`self_distillation_loss`) with the sigmoid ramp-up w(t) (`rampup`), plus FedDyn's dynamic
  regulariser (`feddyn_penalty`, Acar et al., ICLR 2021, Alg. 1) with per-client state
  grad_prev kept by the server in `ServerState.clients` (`dyn_state_update`).
- Layer-wise aggregation: each tensor is the uniform mean over the round's clients holding it
  (n_k of them); with FedDyn the server state h corrects the parameters (`feddyn_server`).
- Evaluation: the global model's ensemble, the mean of all exits' logits (`test_accuracy`), and
  each classifier alone (`test_accuracy@exit<k>`, k the 1-based layer).

Prefix memory is measured on the configured model at depth d (`model.model_copy(depth=d)`),
the same model a `memory_width` budget is measured on: the inner auxiliary classifiers DepthFL
adds are left out, so the full-width budget holds the full-depth model (with them it misses by a
few KiB and nobody would train the last layers). Local training uses the run's optimizer;
DepthFL's own is SGD at lr 0.1 * 0.998^(round - 1) without momentum and weight decay 1e-3
(`federation: {lr: 0.1, lr_schedule: {kind: exponential, gamma: 0.998}, momentum: 0,
weight_decay: 1e-3}`), 5 local epochs, batch 50.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..config import AlgorithmConfig, ConfigError, ModelConfig, RunConfig
from ..evaluate import Evaluator, scores
from ..models import build_model
from ..models.preresnet20 import PreResNet20Config
from ..types import ClientId, Round, Weights
from . import aggregate
from .base import ClientProcedure, ServerPolicy
from .fedepth import FEDEPTH_MODELS
from .local import Batch, ClientContext, LocalState, Trained
from .messages import ClientResult, ClientTask, FederationContext, ServerState
from .registry import Algorithm, register

KL_EPS = 1e-7
"""Added to the distillation targets' probabilities, as DepthFL's code (`KLLoss`)."""


# --------------------------------------------------------------------------- pure functions


def fitting_depth(depths: Sequence[int], need: Callable[[int], float], budget: float) -> int:
    """The deepest prefix depth (of `depths`, the exits' 1-based layers) whose training memory
    `need(d)` fits `budget`; 0 when none does (the client sits out)."""
    return max((d for d in depths if need(d) <= budget), default=0)


def global_name(key: str, depth: int, full_depth: int) -> str:
    """A prefix model's state-dict name in the global model: its head, when the prefix ends
    before the last layer, is the global auxiliary classifier `aux.<depth-1>`."""
    if depth < full_depth and key.startswith("head."):
        return f"aux.{depth - 1}." + key[len("head.") :]
    return key


def rampup(t: float, length: int) -> float:
    """w(t) = exp(-5 (1 - min(t, T) / T)^2), the sigmoid ramp-up of the distillation weight with
    t = round - 1 and T = `length` (DepthFL's code: T = 300); 1 for T = 0."""
    if length == 0:
        return 1.0
    phase = 1.0 - min(max(t, 0.0), length) / length
    return float(math.exp(-5.0 * phase * phase))


def kl_to(target: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(target) || softmax(logits)) at T = 1, averaged over the batch, the target
    detached with `KL_EPS` added to its probabilities (DepthFL's code)."""
    p = F.softmax(target.detach(), 1) + KL_EPS
    return (p * (p.log() - F.log_softmax(logits, 1))).sum(1).mean()


def self_distillation_loss(logits: Sequence[torch.Tensor], y: torch.Tensor, w: float) -> torch.Tensor:
    """L = sum_i [CE(z_i, y) + w / (K - 1) sum_{j != i} KL(softmax(z_j) || softmax(z_i))] over the
    prefix's K classifiers, z_j detached (DepthFL's mutual self-distillation; w = 0: CE only)."""
    k = len(logits)
    loss = sum(F.cross_entropy(z, y) for z in logits)
    if w and k > 1:
        loss = loss + w / (k - 1) * sum(
            kl_to(zj, zi) for i, zi in enumerate(logits) for j, zj in enumerate(logits) if j != i
        )
    return loss


def feddyn_penalty(
    params: Mapping[str, torch.Tensor],
    theta_glob: Mapping[str, torch.Tensor],
    grad_prev: Mapping[str, torch.Tensor],
    alpha: float,
) -> torch.Tensor:
    """FedDyn's client regulariser (Alg. 1): -<theta, grad_prev> + alpha / 2 ||theta - theta_glob||^2."""
    linear = sum((p * grad_prev[k]).sum() for k, p in params.items())
    quadratic = sum(((p - theta_glob[k]) ** 2).sum() for k, p in params.items())
    return -linear + alpha / 2 * quadratic


def dyn_state_update(
    grad_prev: Mapping[str, torch.Tensor],
    theta: Mapping[str, torch.Tensor],
    theta_glob: Mapping[str, torch.Tensor],
    alpha: float,
) -> dict[str, torch.Tensor]:
    """FedDyn's client state after training (Alg. 1): grad_prev <- grad_prev - alpha (theta - theta_glob),
    in float64 on the tensors' device."""
    return {k: g.double() - alpha * (theta[k].double() - theta_glob[k].double()) for k, g in grad_prev.items()}


def feddyn_server(
    old: Weights,
    mean: Weights,
    counts: Mapping[str, float],
    h: Mapping[str, np.ndarray],
    alpha: float,
    num_clients: int,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """FedDyn's server step (Alg. 1) per tensor k held by n_k = `counts[k]` of the round's clients:
    h_k <- h_k - alpha (n_k / N) (mean_k - theta_k), theta_k <- mean_k - h_k / alpha for the
    parameters (the keys of `h`); other held tensors (norm statistics) take `mean`, tensors
    nobody held keep their value and their h. N is the federation's client count."""
    h_new, theta = dict(h), {}
    for k in counts:
        m = np.asarray(mean[k], np.float64)
        if k in h:
            h_new[k] = h[k] - alpha * counts[k] / num_clients * (m - np.asarray(old[k], np.float64))
            m = m - h_new[k] / alpha
        theta[k] = m
    return aggregate.merge(old, theta), h_new


def ensemble_scores(per_exit: Sequence[torch.Tensor], y: torch.Tensor, layers: Sequence[int]) -> dict[str, float]:
    """Test metrics of the ensemble, the mean of all exits' logits (`test_accuracy`,
    `test_loss`), and of each exit's classifier alone (`test_accuracy@exit<layer>`)."""
    ensemble = scores(torch.stack(list(per_exit)).mean(0), y)
    out = {"test_accuracy": ensemble["accuracy"], "test_loss": ensemble["loss"]}
    out.update((f"test_accuracy@exit{layer}", scores(z, y)["accuracy"]) for layer, z in zip(layers, per_exit))
    return out


def exit_logits(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """z_1 .. z_K: the logits of a prefix model's classifiers, shallowest first (a prefix's head
    is the auxiliary classifier at its last layer, `preresnet20`)."""
    z = model.enter(x)
    out = []
    for i, layer in enumerate(model.layers[:-1]):
        z = layer(z)
        if str(i) in model.aux:
            out.append(model.exit(z, i, aux=True))
    out.append(model.head(model.layers[-1](z)))
    return out


# --------------------------------------------------------------------------- config and task


class DepthFLConfig(AlgorithmConfig):
    name: str = "depthfl"
    kd: bool = Field(
        True,
        description="mutual self-distillation among the local model's classifiers (false: CE at each classifier only)",
    )
    kd_rampup_rounds: int = Field(
        300,
        ge=0,
        description="T of the distillation ramp-up w(t) = exp(-5 (1 - min(t, T) / T)^2), t = round - 1 (0: w = 1)",
    )
    feddyn: bool = Field(
        True, description="FedDyn's dynamic regulariser and server correction (false: DepthFL (FedAvg))"
    )
    alpha: float = Field(0.1, gt=0, description="FedDyn's alpha")


@dataclass(frozen=True, kw_only=True)
class DepthFLTask(ClientTask):
    """The prefix's head stands for the global auxiliary classifier after its last layer."""

    kd_weight: float = 0.0
    """w(t) of this round (0: no distillation)."""
    feddyn: bool = False
    alpha: float = 0.1
    grad_prev: Weights | None = None
    """FedDyn's client state over the prefix's parameters (None: zeros, the client's first round)."""


# --------------------------------------------------------------------------- server


class DepthFLPolicy(ServerPolicy):
    """Depth-scaled prefixes by memory budget; per-tensor means over holders, FedDyn-corrected."""

    DEFAULT_AUX = "3-6"

    def __init__(self, config: RunConfig, context: FederationContext):
        super().__init__(config, context)
        self.variant = (
            config.model if config.model.aux_heads else config.model.model_copy(update={"aux_heads": self.DEFAULT_AUX})
        )
        self.full_depth = self.variant.depth
        self.exits = (*self.variant.aux_layers(), self.full_depth - 1)
        """0-based layers followed by a classifier."""
        self.variants = {i + 1: self.variant.model_copy(update={"depth": i + 1}) for i in self.exits}
        self.prefix_keys = {
            d: list(build_model(v, context.input_shape, context.num_classes).state_dict())
            for d, v in self.variants.items()
        }
        model = build_model(self.variant, context.input_shape, context.num_classes)
        self.shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        self.params = sorted(k for k, _ in model.named_parameters())
        """The global model's parameters (its auxiliary classifiers' included): FedDyn's h covers them."""
        need = lambda d: context.training_memory(config.model.model_copy(update={"depth": d}))
        budgets, inverse = np.unique(context.memory_bytes, return_inverse=True)
        self.budget_depths = {float(b): fitting_depth(list(self.variants), need, float(b)) for b in budgets}
        self.client_depths = np.array(list(self.budget_depths.values()), dtype=int)[inverse]
        if not self.client_depths.any():
            raise ConfigError(
                f"devices.profile: no client's memory budget holds the shallowest prefix (depth {min(self.variants)})"
            )

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        if not isinstance(config.model, PreResNet20Config):
            raise ConfigError(f"model.name: depthfl trains depth prefixes of preresnet20, not {config.model.name}")

    def global_model(self) -> ModelConfig:
        return self.variant

    def collapsed(self) -> str | None:
        if (self.client_depths == self.full_depth).all():
            return "every client's memory budget holds the full depth"
        return None

    def init_state(self, weights: Weights) -> ServerState:
        """The global model; with FedDyn, h = 0 over its parameters."""
        h = {k: np.zeros(self.shapes[k]) for k in self.params} if self.config.algorithm.feddyn else None
        return ServerState(round=0, weights=dict(weights), opt_state=h)

    def eligible(self, round: Round) -> np.ndarray:
        """The clients that fit a prefix."""
        return self.client_depths > 0

    def prefix(self, weights: Weights, depth: int) -> dict[str, np.ndarray]:
        """The depth-d prefix's tensors, by its own state-dict names."""
        return {k: weights[global_name(k, depth, self.full_depth)] for k in self.prefix_keys[depth]}

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        cfg = self.config.algorithm
        w = rampup(round - 1, cfg.kd_rampup_rounds) if cfg.kd else 0.0
        prefixes: dict[int, dict[str, np.ndarray]] = {}
        tasks = []
        for c in clients:
            d = int(self.client_depths[c])
            if d not in prefixes:
                prefixes[d] = self.prefix(state.weights, d)
            grad_prev = state.clients.get(c) if cfg.feddyn else None
            tasks.append(
                self.task(
                    c,
                    round,
                    prefixes[d],
                    kind=DepthFLTask,
                    model=self.variants[d],
                    kd_weight=w,
                    feddyn=cfg.feddyn,
                    alpha=cfg.alpha,
                    grad_prev=grad_prev,
                )
            )
        return tasks

    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """The client's tensors under their global names, each counted once (uniform weights)."""
        d = int(self.client_depths[result.client_id])
        held = {global_name(k, d, self.full_depth): v for k, v in result.weights.items()}
        return aggregate.count_sum({k: self.shapes[k] for k in held}, held)

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """Layer-wise: each tensor the mean over its n_k holders (others keep their value), then
        FedDyn's server step; each client's grad_prev kept for its next round."""
        if not total:
            return state.replace(round=round)
        mean = aggregate.count_finish(state.weights, total)
        h = state.opt_state
        if self.config.algorithm.feddyn:
            counts = {
                k[: -len(aggregate.COUNT)]: float(v.max()) for k, v in total.items() if k.endswith(aggregate.COUNT)
            }
            mean, h = feddyn_server(
                state.weights, mean, counts, h, self.config.algorithm.alpha, self.context.num_clients
            )
        clients = dict(state.clients)
        clients.update((r.client_id, dict(r.keep["grad_prev"])) for r in results if "grad_prev" in r.keep)
        return state.replace(round=round, weights=mean, opt_state=h, clients=clients)

    def evaluate(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """The global model's ensemble of all exits, and each exit alone."""
        model = evaluator.models.load(self.variant, state.weights)
        model.eval()
        with torch.no_grad():
            batches = (
                torch.tensor(evaluator.x_test[i : i + evaluator.batch_size])
                for i in range(0, len(evaluator.y), evaluator.batch_size)
            )
            per_exit = [torch.cat(z) for z in zip(*(exit_logits(model, x) for x in batches))]
        return ensemble_scores(per_exit, evaluator.y, [i + 1 for i in self.exits])

    def summary(self) -> dict[str, Any]:
        return {
            "exits": [i + 1 for i in self.exits],
            "depths": {f"{b / 2**20:.2f} MiB": d for b, d in self.budget_depths.items()},
        }


# --------------------------------------------------------------------------- client


@dataclass
class DynState:
    """One client's round: its task, and FedDyn's tensors: its parameters, theta_glob (the prefix
    it received) and grad_prev (zeros in its first round)."""

    task: DepthFLTask
    params: dict[str, torch.Tensor]
    theta_glob: dict[str, torch.Tensor]
    grad_prev: dict[str, torch.Tensor]


class DepthFLClient(ClientProcedure):
    """Local epochs on the self-distillation loss (plus FedDyn's regulariser) over the prefix."""

    def init(self, task: DepthFLTask, ctx: ClientContext) -> LocalState:
        model = ctx.load(task.model, task.weights).train()
        params = dict(model.named_parameters())
        previous = ctx.on_device(task.grad_prev) if task.grad_prev else {}
        dyn = DynState(
            task,
            params,
            {k: p.detach().clone() for k, p in params.items()},
            {k: previous[k].to(p.dtype) if previous else torch.zeros_like(p) for k, p in params.items()},
        )
        return LocalState(model, ctx.optimizer(task.optimizer, model), dyn)

    def step(self, state: LocalState, batch: Batch) -> dict[str, torch.Tensor]:
        """The objective (checked) and the self-distillation loss (reported)."""
        dyn = state.extras
        task = dyn.task
        x, y = batch
        loss = self_distillation_loss(exit_logits(state.model, x), y, task.kd_weight)
        objective = (
            loss + feddyn_penalty(dyn.params, dyn.theta_glob, dyn.grad_prev, task.alpha) if task.feddyn else loss
        )
        state.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        state.optimizer.step()
        return {"loss": loss.detach(), "objective": objective.detach()}

    def final(self, task: DepthFLTask, state: LocalState, ctx: ClientContext) -> Trained:
        """The prefix's tensors; with FedDyn, the client's new grad_prev (kept by the server)."""
        weights, dyn = ctx.tensors(state.model), state.extras
        keep = (
            {"grad_prev": dyn_state_update(dyn.grad_prev, weights, dyn.theta_glob, task.alpha)} if task.feddyn else {}
        )
        return Trained(weights, metrics={"depth": float(len(state.model.layers))}, keep=keep)


DEPTHFL = register(
    Algorithm(
        "depthfl",
        "DepthFL (Kim et al. 2023): depth-scaled prefixes by memory budget, self-distillation among exits, FedDyn",
        DepthFLConfig,
        DepthFLPolicy,
        DepthFLClient,
        FEDEPTH_MODELS,
        default_profile="fedepth_fair",
        over_every_client="depths from memory budgets",
    )
)

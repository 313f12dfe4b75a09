"""FeDepth's and m-FeDepth's server policies: each client's plan from its budget, tasks that
carry it, and the per-tensor aggregation over the clients that trained each tensor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from pydantic import Field

from ...config import AlgorithmConfig, ConfigError, ModelConfig, RunConfig
from ...devices.cost import nbytes
from ...models import build_model
from ...models.preresnet20 import PreResNet20Config
from ...models.transformer import TransformerConfig
from ...types import ClientId, Round, Weights
from .. import aggregate
from ..base import ServerPolicy
from ..messages import ClientResult, ClientTask, FederationContext, ServerState
from .memory import Plan, measure_layers, plan

FEDEPTH_MODELS = {
    "digits": "preresnet20",
    "mnist1d": "preresnet20",
    "cifar10": "preresnet20",
    "cifar100": "preresnet20",
}
"""The model FeDepth and its baselines (SplitMix, DepthFL) take by default."""


class FeDepthConfig(AlgorithmConfig):
    name: str = "fedepth"
    memory: Literal["blocks", "stage"] = Field(
        "blocks",
        description="what must fit the budget: each block's own training (the paper's Table 1), or all a stage holds "
        "(stem, classifier, weights)",
    )
    cache_prefix: Literal["auto", "always", "never"] = Field(
        "auto",
        description="cache the frozen prefix's outputs when the budget holds them (auto), always, or recompute per "
        "batch",
    )
    frozen_drift: bool = Field(
        False,
        description="one optimizer for all stages whose zeroed gradients keep moving frozen blocks (the public code "
        "under PyTorch 1.7)",
    )
    mkd_models: int = Field(2, ge=1, description="most models a client with surplus memory trains jointly (1: no MKD)")
    mkd_lambda: float = Field(1.0, ge=0, description="weight lambda of the KL terms of mutual knowledge distillation")
    peers: Literal["per_client", "shared"] = Field(
        "per_client",
        description="MKD peers kept per client (paper), or one shared by every client (the public code's accident)",
    )


class MFeDepthConfig(FeDepthConfig):
    """m-FeDepth: auxiliary classifiers after the blocks instead of the skip link to the head."""

    name: str = "mfedepth"


@dataclass(frozen=True, kw_only=True)
class FeDepthTask(ClientTask):
    blocks: tuple[tuple[int, ...], ...] = ()
    skip: int = 0
    aux: bool = False
    """Exit through the auxiliary classifier after each block (m-FeDepth), else the skip link."""
    cache: bool = False
    drift: bool = False
    peers: tuple[Weights, ...] = ()
    """The MKD peers' weights (empty: no MKD)."""
    mkd_lambda: float = 1.0


# --------------------------------------------------------------------------- server


class FeDepthPolicy(ServerPolicy):
    """FedAvg over full-size models trained depth-wise; each tensor averaged over its trainers."""

    aux = False
    ALL_AUX = "1-2-3-4-5-6-7-8"
    """m-FeDepth's classifiers when the model names none: after every layer but the last."""

    def __init__(self, config: RunConfig, context: FederationContext):
        super().__init__(config, context)
        self.variant = config.model
        if self.aux and not config.model.aux_heads:
            self.variant = config.model.model_copy(update={"aux_heads": self.ALL_AUX})
        model = build_model(self.variant, context.input_shape, context.num_classes)
        self.costs = measure_layers(model, context.input_shape)
        self.keys = list(model.state_dict())
        self.shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        exits = [self.costs.head, *self.costs.aux.values()] if self.aux else [self.costs.head]
        slots = self.optimizer(1).state_slots
        cfg = config.algorithm
        self.plans: dict[float, Plan | None] = {}
        for budget in np.unique(context.memory_bytes):
            self.plans[float(budget)] = plan(
                self.costs,
                float(budget),
                config.federation.batch_size,
                slots,
                exits,
                num_examples=int(np.max(context.num_examples)),
                memory=cfg.memory,
                cache=cfg.cache_prefix,
                mkd=cfg.mkd_models,
            )
        self.fits = np.array([self.plans[float(b)] is not None for b in context.memory_bytes])
        """Clients whose budget trains at least the last layer; the others never take part."""
        if not self.fits.any():
            raise ConfigError(
                f"devices.profile: no client's memory budget can train even the last layer of {config.model.name} at "
                f"batch size {config.federation.batch_size}"
            )
        if self.aux:
            ends = {b[-1] for p in self.plans.values() if p for b in p.blocks[:-1]}
            missing = sorted(ends - set(self.costs.aux))
            if missing:
                raise ConfigError(
                    f"model.aux_heads: blocks end after layers {[i + 1 for i in missing]}, which have no auxiliary "
                    "classifier"
                )

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        kinds = (PreResNet20Config,) if cls.aux else (PreResNet20Config, TransformerConfig)
        if not isinstance(config.model, kinds):
            names = " or ".join(k.model_fields["name"].default for k in kinds)
            raise ConfigError(f"model.name: {config.algorithm.name} trains {names} depth-wise, not {config.model.name}")

    def global_model(self) -> ModelConfig:
        return self.variant

    def collapsed(self) -> str | None:
        """Every client's budget trains the whole model in one block: no depth-wise training
        (and no auxiliary classifier for m-FeDepth)."""
        if all(len(p.blocks) == 1 for p in self.plans.values() if p is not None):
            return "every client's memory budget trains the whole model in one block"
        return None

    def plan_of(self, client: ClientId) -> Plan:
        return self.plans[float(self.context.memory_bytes[client])]

    def init_state(self, weights: Weights) -> ServerState:
        """The global model; with MKD, a copy of it to initialise every client's peers from."""
        clients = {"initial": dict(weights)} if any(p and p.models > 1 for p in self.plans.values()) else {}
        return ServerState(round=0, weights=dict(weights), clients=clients)

    def eligible(self, round: Round) -> np.ndarray:
        """The clients whose budget fits a plan."""
        return self.fits

    def peers_of(self, state: ServerState, client: ClientId, n: int) -> tuple[Weights, ...]:
        """The client's MKD peers as kept, or copies of the initial global model."""
        key = "shared" if self.config.algorithm.peers == "shared" else client
        kept = state.clients.get(key, ())
        return tuple(kept) + (state.clients["initial"],) * (n - len(kept))

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        cfg = self.config.algorithm
        tasks = []
        for c in clients:
            p = self.plan_of(c)
            peers = self.peers_of(state, c, p.models - 1) if p.models > 1 else ()
            tasks.append(
                self.task(
                    c,
                    round,
                    state.weights,
                    kind=FeDepthTask,
                    model=self.variant,
                    blocks=p.blocks,
                    skip=p.skip,
                    aux=self.aux,
                    cache=p.cache,
                    drift=cfg.frozen_drift,
                    peers=peers,
                    mkd_lambda=cfg.mkd_lambda,
                )
            )
        return tasks

    def trained(self, client: ClientId) -> list[str]:
        """The state-dict names a client's plan trains: the stem, its layers, the head, and
        (m-FeDepth) the auxiliary classifiers its blocks end at."""
        p = self.plan_of(client)
        layers = {f"layers.{i}." for b in p.blocks for i in b}
        aux = {f"aux.{b[-1]}." for b in p.blocks[:-1]} if self.aux else set()
        return [k for k in self.keys if k.startswith(("stem.", "head.", *layers, *aux))]

    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """Alg. 1 l. 9 per tensor: p_k w_k and p_k over the tensors the client trained."""
        keys = self.trained(result.client_id)
        return aggregate.count_sum(
            {k: self.shapes[k] for k in keys}, {k: result.weights[k] for k in keys}, None, result.num_examples
        )

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """Each tensor: the sample-weighted mean over the round's clients that trained it (others
        keep their value); MKD clients' peers kept for their next round."""
        if not results:
            return state.replace(round=round)
        weights = aggregate.count_finish(state.weights, total)
        clients = dict(state.clients)
        for r in results:  # client-id order: with shared peers the last client's are kept, as the code's loop
            if r.keep:
                clients["shared" if self.config.algorithm.peers == "shared" else r.client_id] = tuple(r.keep["peers"])
        return state.replace(round=round, weights=weights, clients=clients)

    def client_cost(self, task: ClientTask, result: ClientResult) -> tuple[float, int, int]:
        """FLOPs of what each stage runs: the frozen prefix forward (once per sample with a cache,
        else per batch), the block's and the classifier's forward and backward; MKD trains each
        model in full. Each stage ran the same epochs, so a stage's samples are 1 / J of them."""
        c = self.costs
        per_stage = result.num_samples / len(task.blocks)
        n = result.num_examples or per_stage
        flops = 0.0
        for j, block in enumerate(task.blocks):
            prefix = sum(l.forward_flops for l in c.layers[task.skip : block[0]]) + (c.stem.forward_flops if j else 0.0)
            train = sum(c.layers[i].train_flops for i in block) + (c.stem.train_flops if j == 0 else 0.0)
            head = c.aux[block[-1]] if task.aux and block[-1] in c.aux else c.head
            flops += per_stage * (train + head.train_flops) + (n if task.cache and j else per_stage) * prefix
        flops *= 1 + len(task.peers)
        return flops, nbytes(task.weights), nbytes(result.weights)

    def summary(self) -> dict[str, Any]:
        mib = lambda b: b / 2**20
        plans = {
            f"{mib(b):.3f} MiB": p
            and {
                "blocks": [[i + 1 for i in blk] for blk in p.blocks],
                "skip": p.skip,
                "models": p.models,
                "cache": p.cache,
            }
            for b, p in self.plans.items()
        }
        return {"plans": plans, "clients_without_plan": int((~self.fits).sum())}


class MFeDepthPolicy(FeDepthPolicy):
    aux = True

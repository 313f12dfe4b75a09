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

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from . import aggregate
from .base import ClientProcedure, ServerPolicy
from .messages import ClientResult, ClientTask, FederationContext, ServerState
from .registry import Algorithm, register
from ..config import AlgorithmConfig, ConfigError, ModelConfig, RunConfig
from ..devices.cost import flops_on, nbytes, saved_bytes
from ..models import build_model, to_numpy
from ..models.preresnet20 import PreResNet20Config
from ..models.transformer import TransformerConfig
from ..types import ClientId, Round, Weights

FEDEPTH_MODELS = {"digits": "preresnet20", "mnist1d": "preresnet20", "cifar10": "preresnet20", "cifar100": "preresnet20"}
"""The model FeDepth and its baselines (SplitMix, DepthFL) take by default."""
_PROBE = 2


# --------------------------------------------------------------------------- memory


def decompose(costs: Sequence[float], budget: float) -> list[list[int]]:
    """The fewest consecutive blocks of layers whose summed training cost fits `budget`, cut
    greedily from the input side (the paper's Fig. 3: costs {3, 2, 1, .5, .5, .5} GB give
    [[0], [1, 2], [3, 4, 5]] under 3 GB and [[0, 1], [2, 3, 4, 5]] under 5 GB). Greedy is
    optimal here: taking as many layers as fit never leaves a later cut worse off.
    `ConfigError` when one layer alone exceeds the budget (partial training takes over)."""
    blocks: list[list[int]] = []
    used = math.inf
    for i, cost in enumerate(costs):
        if cost > budget:
            raise ConfigError(f"memory budget: layer {i} alone needs {cost:.4g}, more than the budget {budget:.4g}")
        if used + cost > budget:
            blocks.append([])
            used = 0.0
        blocks[-1].append(i)
        used += cost
    return blocks


@dataclass(frozen=True)
class PartCost:
    """One part of the network (stem, a layer, a classifier), per sample where per sample."""

    param_bytes: int
    saved_bytes: float
    """Bytes autograd keeps for its backward, per sample (its activations in training)."""
    output_bytes: float
    """Bytes of its output per sample (what a cached frozen prefix holds)."""
    forward_flops: float
    train_flops: float
    """Forward and backward, input gradient included."""


@dataclass(frozen=True)
class LayerCosts:
    stem: PartCost
    layers: tuple[PartCost, ...]
    head: PartCost
    aux: Mapping[int, PartCost]
    param_bytes: int
    """The whole model's weights (frozen or not, every stage holds them)."""


STEM_EXCLUDES = ("layers.", "head.", "aux.")
"""State-dict prefixes that are not the stem: everything else is (trained with the first block)."""


class _Enter(nn.Module):
    """A depth-sliceable model's stem as a module (`model.enter`), for the FLOP counter."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.enter(x)


def measure_layers(model: nn.Module, input_shape: tuple[int, ...]) -> LayerCosts:
    """Measure each part of a depth-sliceable model (`preresnet20`, `transformer`: a stem
    reached through `enter`, `layers`, a `head`, optional `aux` classifiers) once: its saved
    activations within one training forward of the whole model (each storage attributed to the
    part that first saves it, the stem's being those outside every layer and the head, so the
    parts add up to the model's `ModelCost.activation_bytes`), its parameters, and its FLOPs on
    the input it receives there (`torch.utils.flop_counter`)."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(_PROBE, *input_shape, generator=torch.Generator().manual_seed(0))
    parts = {**{f"layers.{i}": m for i, m in enumerate(model.layers)}, "head": model.head}
    inputs: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            inputs[name] = args[0].detach()

        return hook

    hooks = [m.register_forward_pre_hook(keep(name)) for name, m in parts.items()]
    try:
        saved = saved_bytes(model, x, parts)
    finally:
        for h in hooks:
            h.remove()
    outputs = {name: inputs[nxt] for name, nxt in zip(list(parts)[:-1], list(parts)[1:])}
    nbytes_of = lambda params: sum(p.numel() * p.element_size() for p in params)  # noqa: E731

    def cost(part: nn.Module, z: torch.Tensor, kept: int, out: torch.Tensor | None, params: int | None = None, grad_in: bool = True) -> PartCost:
        with torch.no_grad():
            out = part(z) if out is None else out
        return PartCost(
            param_bytes=nbytes_of(part.parameters()) if params is None else params,
            saved_bytes=kept / _PROBE,
            output_bytes=out[0].numel() * out.element_size(),
            forward_flops=flops_on(part, z, train=False),
            train_flops=flops_on(part, z.clone().requires_grad_(grad_in), train=True),
        )

    costs = {name: cost(m, inputs[name], saved[name], outputs.get(name)) for name, m in parts.items()}
    stem_params = nbytes_of(p for n, p in model.named_parameters() if not n.startswith(STEM_EXCLUDES))
    stem = cost(_Enter(model), x, saved[""], inputs["layers.0"], stem_params, grad_in=False)
    aux = {}
    for key, head in getattr(model, "aux", {}).items():
        z = outputs[f"layers.{key}"]
        aux[int(key)] = cost(head, z, sum(saved_bytes(head, z.clone().requires_grad_()).values()), None)
    model.load_state_dict(state)
    return LayerCosts(stem, tuple(costs[f"layers.{i}"] for i in range(len(model.layers))), costs["head"], aux, nbytes_of(model.parameters()))


@dataclass(frozen=True)
class Plan:
    """How one client trains in a round: its blocks (layer indices), the first layer it trains
    (> 0: partial training), how many models it trains jointly (> 1: MKD), and whether its
    frozen prefix's outputs are cached."""

    blocks: tuple[tuple[int, ...], ...]
    skip: int = 0
    models: int = 1
    cache: bool = False


def layer_memory(costs: LayerCosts, batch_size: int, slots: int, first: int | None) -> list[float]:
    """Bytes to train each layer in a block: its gradients and `slots` optimizer copies, and one
    batch of its activations; the stem's are added to layer `first` (the first trained; None:
    left out, as the paper's Table 1 leaves it out of B1)."""
    out = [(1 + slots) * c.param_bytes + batch_size * c.saved_bytes for c in costs.layers]
    if first is not None:
        out[first] += (1 + slots) * costs.stem.param_bytes + batch_size * costs.stem.saved_bytes
    return out


def stage_overhead(costs: LayerCosts, batch_size: int, slots: int, exits: Sequence[PartCost]) -> float:
    """What every stage holds beside its block: the whole model's weights and the training of
    its classifier (the costliest of `exits`). The frozen prefix runs without autograd, so its
    transient activations are gone before the block's are kept."""
    return costs.param_bytes + max((1 + slots) * e.param_bytes + batch_size * e.saved_bytes for e in exits)


def plan(costs: LayerCosts, budget: float, batch_size: int, slots: int, exits: Sequence[PartCost], *, num_examples: int, memory: str, cache: str, mkd: int) -> Plan | None:
    """A client's plan under its memory budget (bytes). MKD with up to `mkd` models when the
    budget holds two full trainings or more (the whole model's training memory, as measured for
    the width budgets). Else the decomposition of the layers from the first one whose every
    successor fits alone (partial training skips the layers before it). `memory: blocks` puts
    each block's own training against the budget, as the paper's Table 1 compares blocks with
    widths; `stage` counts all a stage holds: the stem with the first block, the classifier's
    training and every weight (`stage_overhead`). None when not even the last layer fits."""
    full = sum(layer_memory(costs, batch_size, slots, 0)) + stage_overhead(costs, batch_size, slots, [costs.head])
    everything = (tuple(range(len(costs.layers))),)
    if mkd > 1 and budget >= 2 * full:
        return Plan(everything, models=int(min(mkd, budget // full)))
    room = budget - (stage_overhead(costs, batch_size, slots, exits) if memory == "stage" else 0.0)
    for skip in range(len(costs.layers)):
        need = layer_memory(costs, batch_size, slots, skip if memory == "stage" else None)[skip:]
        if max(need) <= room:
            blocks = tuple(tuple(skip + i for i in b) for b in decompose(need, room))
            widest = max(sum(need[i - skip] for i in b) for b in blocks)
            prefix = costs.layers[blocks[-1][0] - 1].output_bytes * num_examples if len(blocks) > 1 else 0.0
            cached = cache == "always" or (cache == "auto" and len(blocks) > 1 and widest + prefix <= room)
            return Plan(blocks, skip, cache=cached)
    return None


# --------------------------------------------------------------------------- config and task


class FeDepthConfig(AlgorithmConfig):
    name: str = "fedepth"
    memory: Literal["blocks", "stage"] = Field("blocks", description="what must fit the budget: each block's own training (the paper's Table 1), or all a stage holds (stem, classifier, weights)")
    cache_prefix: Literal["auto", "always", "never"] = Field("auto", description="cache the frozen prefix's outputs when the budget holds them (auto), always, or recompute per batch")
    frozen_drift: bool = Field(False, description="one optimizer for all stages whose zeroed gradients keep moving frozen blocks (the public code under PyTorch 1.7)")
    mkd_models: int = Field(2, ge=1, description="most models a client with surplus memory trains jointly (1: no MKD)")
    mkd_lambda: float = Field(1.0, ge=0, description="weight lambda of the KL terms of mutual knowledge distillation")
    peers: Literal["per_client", "shared"] = Field("per_client", description="MKD peers kept per client (paper), or one shared by every client (the public code's accident)")


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

    sums = True
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
                self.costs, float(budget), config.federation.batch_size, slots, exits,
                num_examples=int(np.max(context.num_examples)), memory=cfg.memory, cache=cfg.cache_prefix, mkd=cfg.mkd_models,
            )
        self.fits = np.array([self.plans[float(b)] is not None for b in context.memory_bytes])
        """Clients whose budget trains at least the last layer; the others never take part."""
        if not self.fits.any():
            raise ConfigError(f"devices.profile: no client's memory budget can train even the last layer of {config.model.name} at batch size {config.federation.batch_size}")
        if self.aux:
            ends = {b[-1] for p in self.plans.values() if p for b in p.blocks[:-1]}
            missing = sorted(ends - set(self.costs.aux))
            if missing:
                raise ConfigError(f"model.aux_heads: blocks end after layers {[i + 1 for i in missing]}, which have no auxiliary classifier")

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        kinds = (PreResNet20Config,) if cls.aux else (PreResNet20Config, TransformerConfig)
        if not isinstance(config.model, kinds):
            names = " or ".join(k.model_fields["name"].default for k in kinds)
            raise ConfigError(f"model.name: {config.algorithm.name} trains {names} depth-wise, not {config.model.name}")

    def global_model(self) -> ModelConfig:
        return self.variant

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
            tasks.append(self.task(c, round, state.weights, kind=FeDepthTask, model=self.variant, blocks=p.blocks, skip=p.skip, aux=self.aux, cache=p.cache, drift=cfg.frozen_drift, peers=peers, mkd_lambda=cfg.mkd_lambda))
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
        return aggregate.count_sum({k: self.shapes[k] for k in keys}, {k: result.weights[k] for k in keys}, None, result.num_examples)

    def aggregate(self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]) -> ServerState:
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
        mib = lambda b: b / 2**20  # noqa: E731
        plans = {f"{mib(b):.3f} MiB": p and {"blocks": [[i + 1 for i in blk] for blk in p.blocks], "skip": p.skip, "models": p.models, "cache": p.cache} for b, p in self.plans.items()}
        return {"plans": plans, "clients_without_plan": int((~self.fits).sum())}


class MFeDepthPolicy(FeDepthPolicy):
    aux = True


# --------------------------------------------------------------------------- client


def mkd_loss(logits: torch.Tensor, peers: Sequence[torch.Tensor], y: torch.Tensor, lam: float) -> torch.Tensor:
    """One model's MKD loss: CE(z, y) + lambda / (M - 1) sum_m' KL(softmax(z_m') || softmax(z)),
    peers detached, KL averaged over the batch (Deep Mutual Learning, Zhang et al. 2018)."""
    log_p = F.log_softmax(logits, 1)
    kl = sum(F.kl_div(log_p, F.softmax(z.detach(), 1), reduction="batchmean") for z in peers)
    return F.cross_entropy(logits, y) + lam / len(peers) * kl


class FeDepthClient(ClientProcedure):
    """Depth-wise sequential training (problem (1) per block), or MKD for surplus memory."""

    def run(self, task: FeDepthTask, data, ctx) -> ClientResult:
        if task.peers:
            return self.run_mkd(task, data, ctx)
        model = ctx.load(task.model, task.weights)
        stem = [m for name, m in model.named_children() if f"{name}." not in STEM_EXCLUDES]
        stem_params = [p for name, p in model.named_parameters() if not name.startswith(STEM_EXCLUDES)]  # a transformer's position embedding has no module
        shared = task.optimizer.build(model.parameters()) if task.drift else None
        total, samples = 0.0, 0
        for j, block in enumerate(task.blocks):
            head = model.aux[str(block[-1])] if task.aux and block[-1] < len(model.layers) - 1 else model.head
            trainable = [model.layers[i] for i in block] + [head] + (stem if j == 0 else [])
            model.requires_grad_(False)
            for m in trainable:
                m.train()
            params = list({id(p): p for p in [*(p for m in trainable for p in m.parameters()), *(stem_params if j == 0 else [])]}.values())
            for p in params:
                p.requires_grad_(True)
            optimizer = shared or task.optimizer.build(params)
            frozen = [model.layers[i] for i in range(task.skip, block[0])]
            for m in frozen + (stem if j else []):
                m.eval()  # frozen: batch-statistics norms (the default) as in training, running ones fixed
            cache = self.prefix(model, task, frozen, data) if task.cache and j else None
            loss_sum = 0.0
            for b in ctx.batches(task, len(data), purpose=f"stage-{j}"):
                x, y = data.batch(b)
                if cache is not None:
                    z = cache[b]
                elif j == 0:
                    z = model.enter(x, task.skip)
                else:
                    with torch.no_grad():
                        z = model.enter(x, task.skip)
                        for m in frozen:
                            z = m(z)
                for i in block:
                    z = model.layers[i](z)
                loss = F.cross_entropy(model.exit(z, block[-1], task.aux), y)
                optimizer.zero_grad(set_to_none=not task.drift)
                loss.backward()
                optimizer.step()
                loss_sum += ctx.finite(float(loss.detach())) * len(b)
                samples += len(b)
            total = loss_sum  # the code reports the last stage's loss
        model.requires_grad_(True)
        per_stage = samples // len(task.blocks)
        return ClientResult.of(task, weights=to_numpy(model), num_examples=len(data), num_samples=samples, train_loss=total / max(per_stage, 1), metrics={"stages": float(len(task.blocks))})

    @staticmethod
    def prefix(model: nn.Module, task: FeDepthTask, frozen: Sequence[nn.Module], data) -> torch.Tensor:
        """The frozen prefix's outputs for every sample, in batches of the task's size."""
        out = []
        with torch.no_grad():
            for i in range(0, len(data), task.batch_size):
                z = model.enter(data.x[i : i + task.batch_size], task.skip)
                for m in frozen:
                    z = m(z)
                out.append(z)
        return torch.cat(out)

    def run_mkd(self, task: FeDepthTask, data, ctx) -> ClientResult:
        """The global model and its peers trained jointly on each batch; only the global one is uploaded."""
        models = [ctx.load(task.model, task.weights)] + [ctx.build(task.model) for _ in task.peers]
        for m, w in zip(models[1:], task.peers):
            m.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in w.items()})
        for m in models:
            m.train()
        optimizers = [task.optimizer.build(m.parameters()) for m in models]
        total, samples = 0.0, 0
        for b in ctx.batches(task, len(data)):
            x, y = data.batch(b)
            logits = [m(x) for m in models]
            for k, (m, opt) in enumerate(zip(models, optimizers)):
                loss = mkd_loss(logits[k], logits[:k] + logits[k + 1 :], y, task.mkd_lambda)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if k == 0:
                    total += ctx.finite(float(loss.detach())) * len(b)
            samples += len(b)
        keep = {"peers": [to_numpy(m) for m in models[1:]]}
        return ClientResult.of(task, weights=to_numpy(models[0]), num_examples=len(data), num_samples=samples, train_loss=total / max(samples, 1), metrics={"stages": 1.0}, keep=keep)


FEDEPTH = register(Algorithm("fedepth", "FeDepth (Zhang et al. 2023): memory-adaptive depth-wise training of the full model, skip links to the head", FeDepthConfig, FeDepthPolicy, FeDepthClient, FEDEPTH_MODELS))
MFEDEPTH = register(Algorithm("mfedepth", "m-FeDepth (Zhang et al. 2023): depth-wise training with auxiliary classifiers per block", MFeDepthConfig, MFeDepthPolicy, FeDepthClient, FEDEPTH_MODELS))

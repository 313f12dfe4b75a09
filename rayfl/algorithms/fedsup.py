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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from .. import rng
from ..config import AlgorithmConfig, ConfigError, ModelConfig, RunConfig
from ..devices.cost import flops_on, nbytes
from ..models import build_model, to_numpy
from ..models.supernet import Block, Stem, Subnet, SupernetConfig, crop, largest, medium, random_subnet, smallest
from ..types import ClientId, Round, Weights
from . import aggregate
from .base import ClientProcedure, ServerPolicy, head_scores
from .fedavg import FedAvgClient
from .local import epoch_batches
from .messages import ClientResult, ClientTask, FederationContext, ServerState
from .registry import Algorithm, register

SUPERNET_MODELS = {
    "digits": "supernet_small",
    "mnist1d": "supernet_small",
    "cifar10": "supernet",
    "cifar100": "supernet",
}


class FedSupConfig(AlgorithmConfig):
    name: str = "fedsup"
    subnets: int = Field(
        3, ge=1, description="M: sub-nets trained per local iteration (the paper: 3; the published runs: 1)"
    )
    sandwich: bool = Field(True, description="the largest and the smallest sub-net always among the M (M >= 3)")
    inplace_distill: bool = Field(
        True, description="the other sub-nets learn from the largest's soft predictions (Eq. 6-7); else from the labels"
    )
    temperature: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="T of the distillation's softmaxes (Sec. 3.3.2 names one, gives no value; the public code: 1)",
    )
    distill_weight: float = Field(
        1.0,
        ge=0,
        le=1,
        description="lambda: a distilled sub-net's loss is lambda T^2 soft-CE + (1 - lambda) CE on the labels (Hinton et al.; the public code: 1, soft targets only)",
    )


class EFedSupConfig(AlgorithmConfig):
    name: str = "efedsup"
    tier_budgets: list[float] | None = Field(
        None,
        description="each device class's budget (weakest first) as a share of the largest sub-net's FLOPs (params); None: evenly from the smallest's share to 1",
    )
    budget: Literal["flops", "params"] = Field(
        "flops", description="what a tier's budget bounds: FLOPs (the paper) or parameters (the public code)"
    )
    aggregation: Literal["fill", "count"] = Field(
        "fill", description="untrained entries: the broadcast values (the paper) or left out of each entry's mean"
    )
    max_draws: int = Field(100, ge=1, description="sub-nets drawn before a client falls back to the smallest")


@dataclass(frozen=True, kw_only=True)
class FedSupTask(ClientTask):
    subnets: int = 1
    sandwich: bool = True
    inplace_distill: bool = True
    temperature: float = 1.0
    distill_weight: float = 1.0


# --------------------------------------------------------------------------- pure functions


def step_subnets(
    config: SupernetConfig, seed: int, round: Round, client: ClientId, step: int, m: int, sandwich: bool, distill: bool
) -> list[Subnet]:
    """The M sub-nets of one local iteration, keyed by (seed, round, client, step): the largest
    first when distilling or sandwiching (the teacher), then random ones, the smallest last under
    the sandwich rule with M >= 3; one random sub-net when M = 1 (Alg. 1 l. 8)."""
    g = rng.generator(seed, f"subnets-{step}", round, client)
    if m == 1:
        return [random_subnet(config, g)]
    first = [largest(config)] if distill or sandwich else [random_subnet(config, g)]
    last = [smallest(config)] if sandwich and m >= 3 else []
    return first + [random_subnet(config, g) for _ in range(m - 1 - len(last))] + last


def distill_loss(
    logits: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, weight: float = 1.0
) -> torch.Tensor:
    """In-place distillation (Eq. 7, with Sec. 3.3.2's temperature T and balance lambda, as
    Hinton et al.): lambda T^2 [-sum softmax(z_T / T) log softmax(z / T)] + (1 - lambda) CE(z, y),
    batch means, z_T the largest's detached prediction. The paper gives no values; T = 1,
    lambda = 1 (soft targets alone) is the public code's `KLLossSoft`."""
    soft = (
        weight
        * temperature**2
        * -(F.softmax(teacher.detach() / temperature, 1) * F.log_softmax(logits / temperature, 1)).sum(1).mean()
    )
    return (
        soft if weight == 1 else soft + (1 - weight) * F.cross_entropy(logits, labels)
    )  # no label loss to build at lambda = 1


def fill_finish(old: Weights, total: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """E-FedSup's aggregation (Sec. 3.5): sum_k p_k w_k / sum_k p_k over the round's clients,
    where a client's w_k is its trained sub-net filled with the broadcast values elsewhere:
    (acc + (W - cnt) old) / W per entry, W the round's total weight."""
    w = float(total[aggregate.WEIGHT])
    out = {}
    for name, g in old.items():
        g = np.asarray(g)
        if name not in total:
            out[name] = g
            continue
        value = (total[name] + (w - total[name + aggregate.COUNT]) * g) / w
        out[name] = aggregate.merge({name: g}, {name: value})[name]
    return out


class SubnetCost(NamedTuple):
    forward_flops: float
    """Inference FLOPs per sample: what a tier's budget bounds (Sec. 3.4, Table 6)."""
    train_flops: float
    """Training FLOPs per sample: what the virtual clock charges."""
    params: int


class SubnetCosts:
    """Forward and training FLOPs per sample and parameters of any sub-net, as sums over its parts
    (the stem, each block at its input and output widths and kernel, the classifier), each part
    measured once (`flops_on`) on a module of exactly its size: FLOPs add up over layers, so a
    sub-net of thousands costs a few dictionary look-ups (rejection sampling draws many)."""

    def __init__(self, config: SupernetConfig, input_shape: tuple[int, ...], num_classes: int):
        self.config, self.input_shape, self.num_classes = config, tuple(input_shape), num_classes
        size = [math.ceil(n / config.stem_stride) for n in input_shape[1:]]
        self.spatial = []
        """Each stage's input size."""
        for stride in config.strides:
            self.spatial.append(tuple(size))
            size = [math.ceil(n / stride) for n in size]
        self._parts: dict[tuple, SubnetCost] = {}

    def part(self, key: tuple, build, shape: tuple[int, ...]) -> SubnetCost:
        """A part's cost; inside the network its input takes a gradient too (the stem's, the
        data, does not)."""
        if key not in self._parts:
            module = build()
            x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0)).requires_grad_(key[0] != "stem")
            self._parts[key] = SubnetCost(
                flops_on(module, x, train=False),
                flops_on(module, x, train=True),
                sum(p.numel() for p in module.parameters()),
            )
        return self._parts[key]

    def __call__(self, s: Subnet) -> SubnetCost:
        cfg, dims = self.config, len(self.input_shape) - 1
        parts = [self.part(("stem",), lambda: _Part(Stem(cfg, self.input_shape)), self.input_shape)]
        c_in = cfg.stem
        for i, (width, depth, kernel) in enumerate(zip(s.widths, s.depths, s.kernels)):
            for j in range(depth):
                stride = cfg.strides[i] if j == 0 else 1
                size = self.spatial[i] if j == 0 else tuple(math.ceil(n / cfg.strides[i]) for n in self.spatial[i])
                build = lambda c=c_in, st=stride: _Part(
                    Block(dims, c, width, kernel, st, cfg.norm, c != width), width, kernel
                )  # noqa: E731
                parts.append(self.part(("block", c_in, width, kernel, stride, size), build, (c_in, *size)))
                c_in = width
        parts.append(self.part(("head", c_in), lambda: torch.nn.Linear(c_in, self.num_classes), (c_in,)))
        return SubnetCost(*(sum(column) for column in zip(*parts)))


class _Part(torch.nn.Module):
    """A supernet part called with its active sizes (what `flops_on` measures)."""

    def __init__(self, part: torch.nn.Module, *sizes: int):
        super().__init__()
        self.part, self.sizes = part, sizes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part(x, *self.sizes)


# --------------------------------------------------------------------------- the policy


class FedSupPolicy(ServerPolicy):
    """FedSup (whole supernet, M sub-nets per step) and, with `efficient`, E-FedSup (one tier sub-net)."""

    efficient = False

    def __init__(self, config: RunConfig, context: FederationContext):
        super().__init__(config, context)
        self.super = config.model
        full = build_model(self.super, context.input_shape, context.num_classes).state_dict()
        self.shapes = {k: tuple(v.shape) for k, v in full.items()}
        self._sub_shapes: dict[Subnet, dict[str, tuple[int, ...]]] = {}
        self.costs = SubnetCosts(self.super, context.input_shape, context.num_classes)
        self.children = {"big": largest(self.super), "medium": medium(self.super), "small": smallest(self.super)}
        if self.efficient:
            classes = context.classes("E-FedSup's tiers")
            cfg = config.algorithm
            lo = self.size(smallest(self.super)) / self.size(largest(self.super))
            self.budgets = (
                list(cfg.tier_budgets) if cfg.tier_budgets is not None else list(np.linspace(lo, 1.0, len(classes)))
            )
            if len(self.budgets) != len(classes):
                raise ConfigError(
                    f"algorithm.tier_budgets: {len(self.budgets)} budgets for the {len(classes)} device classes of profile {config.devices.profile!r}"
                )

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        if not isinstance(config.model, SupernetConfig):
            raise ConfigError(
                f"model.name: {config.algorithm.name} trains a supernet (supernet, supernet_small), not {config.model.name}"
            )

    def size(self, subnet: Subnet) -> float:
        """What a tier's budget bounds: the sub-net's inference FLOPs per sample (the paper), or its
        parameters (`budget: params`, the public code)."""
        cost = self.costs(subnet)
        return float(cost.params if self.efficient and self.config.algorithm.budget == "params" else cost.forward_flops)

    def sub_shapes(self, subnet: Subnet) -> dict[str, tuple[int, ...]]:
        if subnet not in self._sub_shapes:
            model = build_model(subnet.config(self.super), self.context.input_shape, self.context.num_classes)
            self._sub_shapes[subnet] = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        return self._sub_shapes[subnet]

    def subnet(self, state: ServerState, subnet: Subnet) -> dict[str, np.ndarray]:
        """A child's weights: the crop of the supernet's."""
        return aggregate.extract(state.weights, self.sub_shapes(subnet), where=crop)

    def tier_subnet(self, round: Round, client: ClientId) -> Subnet:
        """E-FedSup: sub-nets drawn (keyed by seed, round, client) until one fits the client's
        tier budget; the smallest after `max_draws`."""
        tier = int(self.context.device_classes[client])
        limit = self.budgets[tier] * self.size(largest(self.super)) * (1 + 1e-9)
        g = rng.generator(self.context.seed, "tier-subnet", round, client)
        for _ in range(self.config.algorithm.max_draws):
            s = random_subnet(self.super, g)
            if self.size(s) <= limit:
                return s
        return smallest(self.super)

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        if self.efficient:
            out = []
            for c in clients:
                s = self.tier_subnet(round, c)
                out.append(self.task(c, round, self.subnet(state, s), model=s.config(self.super)))
            return out
        cfg = self.config.algorithm
        options = {
            "subnets": cfg.subnets,
            "sandwich": cfg.sandwich,
            "inplace_distill": cfg.inplace_distill,
            "temperature": cfg.temperature,
            "distill_weight": cfg.distill_weight,
        }
        return [self.task(c, round, state.weights, kind=FedSupTask, **options) for c in clients]

    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """p_k times the client's tensors where they sit in the supernet, the weight of holding
        each entry, and p_k (Alg. 1 l. 13)."""
        n = result.num_examples
        shapes = {k: self.shapes[k] for k in result.weights}
        return {
            **aggregate.count_sum(shapes, result.weights, None, n, where=crop),
            aggregate.WEIGHT: np.array(float(n)),
        }

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        if not total:
            return state.replace(round=round)
        count = self.efficient and self.config.algorithm.aggregation == "count"
        weights = aggregate.count_finish(state.weights, total) if count else fill_finish(state.weights, total)
        return state.replace(round=round, weights=weights)

    def client_cost(self, task: ClientTask, result: ClientResult) -> tuple[float, int, int]:
        """E-FedSup: its sub-net's training. FedSup: every iteration's M sub-nets on its batch
        (replaying the client's draws; iterations of equal size)."""
        if self.efficient:
            return (
                result.num_samples * self.costs(Subnet.of(task.model)).train_flops,
                nbytes(task.weights),
                nbytes(result.weights),
            )

        n = result.num_examples or 1
        steps = task.local_epochs * len(epoch_batches(n, task.batch_size, np.random.default_rng(0)))
        per_step = [
            sum(
                self.costs(s).train_flops
                for s in step_subnets(
                    self.super,
                    self.context.seed,
                    task.round,
                    task.client_id,
                    i,
                    task.subnets,
                    task.sandwich,
                    task.inplace_distill,
                )
            )
            for i in range(steps)
        ]
        return result.num_samples * float(np.mean(per_step)), nbytes(task.weights), nbytes(result.weights)

    def evaluate(self, state: ServerState, round: Round, evaluator) -> dict[str, float]:
        """Big, Medium and Small children on the central test set; `test_accuracy` is Big's."""
        out: dict[str, float] = {}
        for name, s in self.children.items():
            scores = evaluator(self.subnet(state, s), s.config(self.super))
            out[f"test_accuracy@{name}"] = scores["accuracy"]
            if name == "big":
                out.update(test_accuracy=scores["accuracy"], test_loss=scores["loss"])
        return out

    def personalize(self, state: ServerState, round: Round, evaluator) -> dict[str, float]:
        big = self.children["big"]
        return head_scores(
            self, evaluator.models.load(big.config(self.super), self.subnet(state, big)), round, evaluator
        )

    def global_model(self) -> ModelConfig:
        return self.super

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {n: {**self.costs(s)._asdict(), "subnet": s.__dict__} for n, s in self.children.items()}
        if self.efficient:
            out["tier_budgets"] = self.budgets
        return {"children": out}


class EFedSupPolicy(FedSupPolicy):
    efficient = True


class FedSupClient(ClientProcedure):
    """Per batch, the M sub-nets of `step_subnets`: the first on the labels, the others on its
    soft predictions (in-place distillation) or the labels; gradients accumulated, one step; the
    supernet left at its first sub-net."""

    def run(self, task: FedSupTask, data, ctx) -> ClientResult:
        model = ctx.load(task.model, task.weights)
        model.train()
        optimizer = task.optimizer.build(model.parameters())
        total, samples = 0.0, 0
        for step, b in enumerate(ctx.batches(task, len(data))):
            x, y = data.batch(b)
            subnets = step_subnets(
                task.model,
                ctx.seed,
                task.round,
                task.client_id,
                step,
                task.subnets,
                task.sandwich,
                task.inplace_distill,
            )
            optimizer.zero_grad(set_to_none=True)
            model.set_active(subnets[0])
            teacher = model(x)
            loss = F.cross_entropy(teacher, y)
            loss.backward()
            for s in subnets[1:]:
                model.set_active(s)
                z = model(x)
                (
                    distill_loss(z, teacher, y, task.temperature, task.distill_weight)
                    if task.inplace_distill
                    else F.cross_entropy(z, y)
                ).backward()
            model.set_active(subnets[0])
            optimizer.step()
            total += ctx.finite(float(loss.detach())) * len(b)
            samples += len(b)
        model.set_active(largest(task.model))
        return ClientResult.of(
            task,
            weights=to_numpy(model),
            num_examples=len(data),
            num_samples=samples,
            train_loss=total / max(samples, 1),
        )


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
        vectorizable=True,
    )
)

"""SplitMix: "Efficient Split-Mix Federated Learning for On-Demand and In-Situ Customization",
Junyuan Hong, Haotao Wang, Zhangyang Wang, Jiayu Zhou, ICLR 2022 (arXiv:2203.09747), with the
public code's (`illidanlab/SplitMix`) choices (docs/papers.md, SplitMix: public code).

Split: the global model is K = 1 / atom base networks, each the configured model at width rate
`atom`, kept as name-prefixed state (`base<k>.<state-dict name>`). A client whose memory budget
fits width r (`budget.client_rates`) trains n = floor(r / atom) of them (at least 1, at most K):
- the first from a shuffle-cycle sampler, so base usage stays balanced (`first_bases`: a seeded
  permutation of the K bases dealt round-robin over the round's clients in client-id order);
- the others drawn without replacement from the remaining bases (`client_bases`).
Only the chosen bases travel. Each base trains on the client's data independently with
cross-entropy: one optimizer over the sum of the bases' losses (`SplitMixClient`).
Aggregation: each base's tensors are the sample-weighted mean over the round's clients that
trained it; bases nobody trained keep their value (`SplitMixPolicy.aggregate`).
Mix: the model of width r = n atom averages the logits of the first n bases (`mix`).

Left out: the adversarial dual BN and the `rescale_init` / `rescale_layer` options of the code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, field_validator

from .. import rng
from ..config import AlgorithmConfig, ConfigError, ModelConfig, RunConfig
from ..devices.cost import nbytes
from ..evaluate import Evaluator, scores
from ..models import build_model, to_numpy
from ..models.layers import WidthConfig
from ..types import ClientId, Round, Weights
from . import aggregate
from .base import ClientProcedure, ServerPolicy
from .budget import RATE_TOL, client_rates
from .fedepth import FEDEPTH_MODELS
from .local import Batch, ClientContext, LocalState, Trained
from .messages import ClientResult, ClientTask, FederationContext, ServerState
from .registry import Algorithm, register


class SplitMixConfig(AlgorithmConfig):
    name: str = "splitmix"
    atom: float | None = Field(
        None,
        gt=0,
        le=1,
        description="width rate of each base network, 1/K for an integer K bases (None: the smallest client width, "
        "rounded down to 1/K)",
    )

    @field_validator("atom")
    @classmethod
    def _one_over_k(cls, v: float | None) -> float | None:
        if v is not None and abs(1 / v - round(1 / v)) > 1e-3:
            raise ValueError("write atom as 1/K for an integer K, e.g. 0.125 or 0.1666667")
        return v


@dataclass(frozen=True, kw_only=True)
class SplitMixTask(ClientTask):
    bases: tuple[int, ...] = ()
    """The base networks the client trains, first the sampler's; `weights` holds only theirs."""


def prefixed(k: int, weights: Weights) -> dict[str, np.ndarray]:
    """One base network's state under the global names `base<k>.<name>`."""
    return {f"base{k}.{name}": v for name, v in weights.items()}


def unprefixed(k: int, weights: Weights) -> dict[str, np.ndarray]:
    """Base k's own state out of name-prefixed weights."""
    head = f"base{k}."
    return {name[len(head) :]: v for name, v in weights.items() if name.startswith(head)}


def default_atom(rates: np.ndarray) -> float:
    """1/K for the fewest bases K whose width fits the smallest client width (bisected rates sit
    up to `RATE_TOL` below the width that fits): FeDepth's budget 1/6 gives 1/6, HeteroFL's 1/8 gives 1/8."""
    fitting = rates[rates > 0]
    if not len(fitting):
        raise ConfigError("devices.profile: no client's memory budget fits the thinnest model")
    return 1 / math.ceil(1 / (float(fitting.min()) + RATE_TOL))


def bases_per_client(rates: np.ndarray, atom: float) -> np.ndarray:
    """n = floor(r / atom) bases for width r, at least 1 and at most K = 1 / atom."""
    return np.clip(np.floor((rates + RATE_TOL) / atom), 1, round(1 / atom)).astype(int)


def first_bases(seed: int, round: Round, clients: Sequence[ClientId], num_bases: int) -> list[int]:
    """The shuffle-cycle sampler: a permutation of the K bases, a pure function of (seed, round),
    cycled over the round's clients in client-id order, so each base comes first for
    floor(m / K) or ceil(m / K) of the m clients."""
    order = rng.generator(seed, "splitmix", round).permutation(num_bases)
    return [int(order[i % num_bases]) for i in range(len(clients))]


def client_bases(seed: int, round: Round, client: ClientId, first: int, n: int, num_bases: int) -> tuple[int, ...]:
    """The client's n bases: `first`, then n - 1 drawn without replacement from the others,
    keyed by (seed, round, client)."""
    rest = [k for k in range(num_bases) if k != first]
    drawn = rng.generator(seed, "splitmix", round, client).choice(rest, size=n - 1, replace=False)
    return (first, *(int(k) for k in drawn))


def mix(logits: Sequence[torch.Tensor], n: int) -> torch.Tensor:
    """The model of width n atom: the mean of the first n bases' logits."""
    return torch.stack(list(logits[:n])).mean(0)


class SplitMixPolicy(ServerPolicy):
    """K base networks; each client trains its budget's share of them; per-base FedAvg."""

    def __init__(self, config: RunConfig, context: FederationContext):
        super().__init__(config, context)
        rates = client_rates(config, context)
        self.num_bases = round(1 / (config.algorithm.atom or default_atom(rates)))
        self.atom = 1 / self.num_bases
        self.base = config.model.model_copy(update={"rate": self.atom})
        self.counts = bases_per_client(rates, self.atom)
        """(num_clients,) how many bases each client trains."""
        one = build_model(self.base, context.input_shape, context.num_classes).state_dict()
        self.shapes = {k: tuple(v.shape) for b in range(self.num_bases) for k, v in prefixed(b, one).items()}

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        if not isinstance(config.model, WidthConfig):
            raise ConfigError(
                f"model.name: {config.algorithm.name} needs a width-scalable model for its base networks, not "
                f"{config.model.name}"
            )
        if config.model.init_weights is not None:
            raise ConfigError(
                f"model.init_weights: {config.algorithm.name} draws its K base networks itself (init_state); a "
                "pretrained state would be ignored"
            )

    def collapsed(self) -> str | None:
        if (self.counts == self.num_bases).all():
            return "every client's memory budget trains all the base networks"
        return None

    def global_model(self) -> ModelConfig:
        """One base network (what the engine measures); the global model is K of them."""
        return self.base

    def width(self, n: int) -> str:
        """The name of the mix of n bases: its width n atom (`test_accuracy@0.5`)."""
        return f"{n * self.atom:.4g}"

    def init_state(self, weights: Weights) -> ServerState:
        """The K bases, base k drawn under (seed, "init", k); the engine's one-model weights are not used."""
        out: dict[str, np.ndarray] = {}
        for k in range(self.num_bases):
            with rng.seeded_torch(self.context.seed, "init", k):
                out.update(
                    prefixed(k, to_numpy(build_model(self.base, self.context.input_shape, self.context.num_classes)))
                )
        return ServerState(round=0, weights=out)

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        clients = sorted(clients)
        tasks = []
        for c, first in zip(clients, first_bases(self.context.seed, round, clients, self.num_bases)):
            bases = client_bases(self.context.seed, round, c, first, int(self.counts[c]), self.num_bases)
            heads = {f"base{b}" for b in bases}
            weights = {k: v for k, v in state.weights.items() if k.split(".", 1)[0] in heads}
            tasks.append(self.task(c, round, weights, kind=SplitMixTask, model=self.base, bases=bases))
        return tasks

    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """n_k w_k and n_k for the tensors of the bases the client trained."""
        return aggregate.count_sum(
            {k: self.shapes[k] for k in result.weights}, result.weights, None, result.num_examples
        )

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """Each base: the sample-weighted mean over the round's clients that trained it; the
        bases no client trained keep their value."""
        if not results:
            return state.replace(round=round)
        return state.replace(round=round, weights=aggregate.count_finish(state.weights, total))

    def client_cost(self, task: SplitMixTask, result: ClientResult) -> tuple[float, int, int]:
        """Every trained base's forward and backward for every sample; only those bases travel."""
        flops = len(task.bases) * self.context.cost_of(task.model).train_flops * result.num_samples
        return flops, nbytes(task.weights), nbytes(result.weights)

    def evaluate(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """`test_accuracy` / `test_loss` of the full mix (all K bases) and `test_accuracy@<width>`
        of the mix of every client width in use."""
        logits = [evaluator.logits(unprefixed(k, state.weights), self.base) for k in range(self.num_bases)]
        full = scores(mix(logits, self.num_bases), evaluator.y)
        out = {"test_accuracy": full["accuracy"], "test_loss": full["loss"]}
        for n in np.unique(self.counts):
            out[f"test_accuracy@{self.width(int(n))}"] = scores(mix(logits, int(n)), evaluator.y)["accuracy"]
        return out

    def summary(self) -> dict[str, Any]:
        """The atom, K, the whole ensemble's parameters and how many clients have each width."""
        n, clients = np.unique(self.counts, return_counts=True)
        return {
            "atom": self.atom,
            "bases": self.num_bases,
            "ensemble_params": self.num_bases * self.context.cost_of(self.base).num_params,
            "clients_per_width": {self.width(int(k)): int(c) for k, c in zip(n, clients)},
        }


class SplitMixClient(ClientProcedure):
    """Local training of the task's bases, each with cross-entropy on the client's data: one
    optimizer over the sum of their losses (the bases never see each other's outputs). The
    reported `train_loss` is the bases' mean cross-entropy."""

    def init(self, task: SplitMixTask, ctx: ClientContext) -> LocalState:
        weights = ctx.on_device(task.weights)
        nets = [
            ctx.load(task.model, unprefixed(k, weights), slot=f"base-{i}").train() for i, k in enumerate(task.bases)
        ]
        params = [p for net in nets for p in net.parameters()]
        return LocalState(nets[0], ctx.optimizer(task.optimizer, params, slot="bases"), extras=nets)

    def step(self, state: LocalState, batch: Batch) -> torch.Tensor:
        x, y = batch
        loss = sum(F.cross_entropy(net(x), y) for net in state.extras)
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        state.optimizer.step()
        return loss.detach()

    def final(self, task: SplitMixTask, state: LocalState, ctx: ClientContext) -> Trained:
        nets = state.extras
        weights = {k: v for b, net in zip(task.bases, nets) for k, v in prefixed(b, ctx.tensors(net)).items()}
        return Trained(
            weights,
            metrics={"bases": float(len(nets)), "width": len(nets) * task.model.rate},
            train_loss=lambda losses: losses.mean(each=lambda v: v / len(nets)),
        )


SPLITMIX = register(
    Algorithm(
        "splitmix",
        "SplitMix (Hong et al. 2022): K thin base networks, each client trains its budget's share, mixed by "
        "averaging logits",
        SplitMixConfig,
        SplitMixPolicy,
        SplitMixClient,
        FEDEPTH_MODELS,
        default_profile="fedepth_fair",
        over_every_client="base networks per budget",
    )
)

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import torch
from pydantic import Field, field_validator
from torch import nn

from .. import rng
from ..config import AlgorithmConfig, ConfigError, ModelConfig, RunConfig
from ..data import Clients
from ..evaluate import Evaluator, scores
from ..models import ModelCache, build_model
from ..models.layers import DepthConfig, ScaledConfig
from ..types import ClientId, Round, Weights
from . import aggregate
from .base import ServerPolicy
from .budget import client_rates
from .fedavg import FedAvgClient, cross_entropy
from .messages import ClientResult, ClientTask, FederationContext, ServerState
from .registry import Algorithm, register

RATES = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.125, "e": 0.0625}
_MIX = re.compile(r"^[a-e]\d+(-[a-e]\d+)*$")


@dataclass(frozen=True)
class Level:
    name: str
    rate: float
    proportion: int


def parse_levels(mix: str) -> list[Level]:
    """`a1-b1-e2` -> levels a, b, e with proportions 1, 1, 2 (the global model is the first)."""
    return [Level(tok[0], RATES[tok[0]], int(tok[1:])) for tok in mix.split("-")]


class HeteroFLConfig(AlgorithmConfig):
    name: str = "heterofl"
    levels: str = Field("a1-b1-c1-d1-e1", description="level mix: letters a..e (rates 1..1/16) with proportions")
    mode: Literal["fix", "dynamic", "capability", "class", "budget"] = Field(
        "dynamic",
        description="how clients get levels (budget: the widest width that fits each client's memory, levels from the budgets)",
    )
    mask: Literal["zero", "-inf", "none"] = Field("zero", description="masked cross-entropy fill (zero: public code)")
    label_split_rows: bool = Field(
        True,
        description="aggregate classifier rows over only the clients whose label split has the class (the public code always does)",
    )
    sbn_clients: float = Field(1.0, gt=0, le=1, description="share of clients whose training data calibrate static BN")
    weighting: Literal["count", "samples"] = Field(
        "count", description="count: HeteroFL's plain per-entry mean; samples: FedAvg's n_k weights"
    )
    match_depths: str | None = Field(
        None,
        pattern=r"^\d+(-\d+)*$",
        description="level rates that match the parameter counts of these depths of a depth-sliceable model, e.g. 2-4-6",
    )

    @field_validator("levels")
    @classmethod
    def _mix(cls, v: str) -> str:
        if (
            not _MIX.match(v)
            or any(int(t[1:]) == 0 for t in v.split("-"))
            or len({t[0] for t in v.split("-")}) != len(v.split("-"))
        ):
            raise ValueError("write levels like a1-b1-e1: distinct letters a..e, each with a positive proportion")
        return v


def matched_levels(levels: Sequence[Level], config: RunConfig, context: FederationContext) -> list[Level]:
    """The levels with the width rates whose models have the parameter counts of the depth-cut
    models (`match_depths`, largest depth first): the global level keeps rate 1 at the largest
    depth; each other rate sits on the side of the step, where params(rate) jumps past
    params(depth) (bisection to 1e-4), whose count is nearer."""
    from scipy import optimize  # lazily: most runs never match depths

    depths = sorted((int(d) for d in config.algorithm.match_depths.split("-")), reverse=True)
    if not isinstance(config.model, DepthConfig):
        raise ConfigError(f"algorithm.match_depths: model {config.model.name} has no depth to match")
    if len(depths) != len(levels) or depths[0] != config.model.depth:
        raise ConfigError(
            f"algorithm.match_depths: one depth per level ({len(levels)}), the largest model.depth ({config.model.depth})"
        )
    params = lambda **change: sum(
        p.numel()
        for p in build_model(
            config.model.model_copy(update=change), context.input_shape, context.num_classes
        ).parameters()
    )  # noqa: E731
    rates = [1.0]
    for depth in depths[1:]:
        target = params(depth=depth)
        step = optimize.bisect(lambda r: params(rate=r) - target, 1e-3, 1.0, xtol=1e-4)
        rates.append(min((step - 2e-4, step + 2e-4), key=lambda r: abs(params(rate=r) - target)))
    return [Level(level.name, rate, level.proportion) for level, rate in zip(levels, rates)]


def budget_levels(rates: np.ndarray) -> tuple[list[Level], np.ndarray]:
    """Levels from each client's widest fitting width rate (`budget.client_rates`), widest first,
    named by rate, with the full width as the global level (proportion 0 when nobody fits it);
    and each client's level (-1 for a rate of 0: nothing fits)."""
    distinct = sorted({float(r) for r in rates if r > 0}, reverse=True)
    if distinct[0] < 1.0:
        distinct.insert(0, 1.0)
    levels = [Level(f"{r:.3g}", r, int((rates == r).sum())) for r in distinct]
    return levels, np.array([distinct.index(float(r)) if r > 0 else -1 for r in rates])


def assign_fix(levels: Sequence[Level], num_clients: int) -> np.ndarray:
    """Public code `fix`: level k repeated q * p_k times in order, q = floor(N / sum p); the rest get the last."""
    q = num_clients // sum(l.proportion for l in levels)
    out = np.concatenate([np.full(q * l.proportion, k) for k, l in enumerate(levels)]).astype(int)
    return np.concatenate([out, np.full(num_clients - len(out), len(levels) - 1)]).astype(int)


def assign_capability(levels: Sequence[Level], memory_needed: Sequence[float], budgets: np.ndarray) -> np.ndarray:
    """The widest level whose training memory fits each client's budget; -1 when none fits."""
    order = sorted(range(len(levels)), key=lambda k: -levels[k].rate)
    out = np.full(len(budgets), -1)
    for c, budget in enumerate(budgets):
        out[c] = next((k for k in order if memory_needed[k] <= budget), -1)
    return out


@dataclass(frozen=True, kw_only=True)
class HeteroFLTask(ClientTask):
    label_split: tuple[int, ...] = ()
    """Classes of the client's data: the masked cross-entropy keeps only these."""

    def columns(self) -> dict[str, Any]:
        """FedAvg's columns and the width rate of the client's level (`model_rate`)."""
        return {**super().columns(), "model_rate": self.model.rate}


class HeteroFLPolicy(ServerPolicy):
    def __init__(self, config: RunConfig, context: FederationContext):
        super().__init__(config, context)
        if not isinstance(config.model, ScaledConfig):
            raise ConfigError(
                f"model.name: {config.algorithm.name} needs a width-scalable model with a Scaler (cnn, mlp, cnn1d, preresnet18)"
            )
        self.levels = parse_levels(config.algorithm.levels)
        if config.algorithm.match_depths:
            self.levels = matched_levels(self.levels, config, context)
        if config.algorithm.mode == "budget":
            self.levels, by_budget = budget_levels(client_rates(config, context))
        g = self.levels[0].rate
        self.variants = [config.model.model_copy(update={"rate": l.rate, "scaler": l.rate / g}) for l in self.levels]
        self.shapes = [self._shapes(v) for v in self.variants]
        self.label_splits = [tuple(int(c) for c in np.flatnonzero(h)) for h in context.label_histogram()]
        mode = config.algorithm.mode
        if mode == "fix":
            self.fixed = assign_fix(self.levels, context.num_clients)
        elif mode == "capability":
            need = [context.training_memory(v) for v in self.variants]
            self.fixed = assign_capability(self.levels, need, context.memory_bytes)
            if (self.fixed < 0).all():
                raise ConfigError(
                    f"algorithm.levels: no client's memory budget fits any level of {config.algorithm.levels}"
                )
        elif mode == "budget":
            self.fixed = by_budget
        elif mode == "class":
            classes = context.classes("algorithm.mode class")
            if len(classes) != len(self.levels):
                raise ConfigError(
                    f"algorithm.levels: mode class needs one level per device class ({len(classes)} in profile {config.devices.profile!r}), not {len(self.levels)}"
                )
            self.fixed = len(classes) - 1 - np.asarray(context.device_classes)
        else:
            self.fixed = None
        self.classifier = _classifier_keys(self.shapes[0])

    def _shapes(self, variant: ModelConfig) -> dict[str, tuple[int, ...]]:
        model = build_model(variant, self.context.input_shape, self.context.num_classes)
        return {k: tuple(v.shape) for k, v in model.state_dict().items()}

    def global_model(self) -> ModelConfig:
        return self.variants[0]

    def collapsed(self) -> str | None:
        """A level dealt by memory (`capability`, `budget`; ExclusiveFL) that is the same for every client."""
        if self.config.algorithm.mode in ("capability", "budget") and len(set(self.fixed.tolist())) == 1:
            return f"every client's memory budget fits the same level ({self.levels[int(self.fixed[0])].rate:g} of the width)"
        return None

    def level_of(self, round: Round, client: ClientId) -> int:
        """The client's level this round (-1: it fits none and sits the round out)."""
        if self.fixed is not None:
            return int(self.fixed[client])
        p = np.array([l.proportion for l in self.levels], float)
        return int(rng.generator(self.context.seed, "level", round, client).choice(len(self.levels), p=p / p.sum()))

    def eligible(self, round: Round) -> np.ndarray | None:
        """The clients with a level (every client when levels are drawn each round)."""
        return None if self.fixed is None else self.fixed >= 0

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        tasks = []
        for c in clients:
            k = self.level_of(round, c)
            weights = aggregate.extract(state.weights, self.shapes[k])
            tasks.append(
                self.task(
                    c, round, weights, kind=HeteroFLTask, model=self.variants[k], label_split=self.label_splits[c]
                )
            )
        return tasks

    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """Sec. 3.1: the client's entries in the global shapes and the entries it holds, its
        classifier rows restricted to its label split (`label_split_rows`); weighted by n_k
        with `weighting: samples`."""
        mask = (
            {k: self.class_mask(result.client_id) for k in self.classifier}
            if self.config.algorithm.label_split_rows
            else None
        )
        weight = result.num_examples if self.config.algorithm.weighting == "samples" else 1.0
        return aggregate.count_sum(self.shapes[0], result.weights, mask, weight)

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """Sec. 3.1: per-entry mean over the clients holding it; classifier rows by label split."""
        if not results:
            return state.replace(round=round)
        return state.replace(round=round, weights=aggregate.count_finish(state.weights, total))

    def class_mask(self, client: ClientId) -> np.ndarray:
        mask = np.zeros(self.context.num_classes, bool)
        mask[list(self.label_splits[client])] = True
        return mask

    def calibration_batches(self, round: Round, clients: Clients) -> list[np.ndarray]:
        """sBN: the training inputs of all (or a seeded share of) clients in batches, shuffled."""
        g = rng.generator(self.context.seed, "sbn", round)
        share, n = self.config.algorithm.sbn_clients, clients.num_clients
        chosen = np.arange(n) if share >= 1 else g.choice(n, max(1, int(np.ceil(share * n))), replace=False)
        x = np.concatenate([clients.train(int(c))[0] for c in sorted(chosen)])
        x = x[g.permutation(len(x))]
        b = self.config.federation.batch_size
        return [x[i : i + b] for i in range(0, len(x), b) if len(x[i : i + b]) > 1]

    def evaluate(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """Global (unmasked) accuracy of the global model, `test_accuracy@<level>` of every level's
        sub-model, and `test_accuracy_local`: the mean over clients of masked accuracy on their own
        test split (shards) or on the test samples of their classes."""
        calibrate = None
        if getattr(self.config.model, "norm", None) == "sbn":
            calibrate = self.calibration_batches(round, evaluator.clients)
        y = evaluator.y
        out: dict[str, float] = {}
        for k, (level, variant) in enumerate(zip(self.levels, self.variants)):
            weights = aggregate.extract(state.weights, self.shapes[k])
            model = (
                evaluator.models.load(variant, weights)
                if calibrate is None
                else static_bn(evaluator.models, variant, weights, calibrate)
            )
            logits = evaluator.logits_of(model)
            acc = scores(logits, y)
            if k == 0:
                out.update(
                    test_accuracy=acc["accuracy"],
                    test_loss=acc["loss"],
                    test_accuracy_local=self.local_accuracy(logits, y),
                )
            out[f"test_accuracy@{level.name}"] = acc["accuracy"]
        return out

    def local_accuracy(self, logits: torch.Tensor, y: torch.Tensor) -> float:
        accs = []
        for c in range(self.context.num_clients):
            mask = torch.from_numpy(self.class_mask(c))
            idx = (
                self.context.test_split[c]
                if self.context.test_split is not None
                else np.flatnonzero(mask.numpy()[y.numpy()])
            )
            if len(idx):
                masked = masked_logits(logits[idx], mask, self.config.algorithm.mask)
                accs.append(float((masked.argmax(1) == y[idx]).float().mean()))
        return float(np.mean(accs)) if accs else float("nan")

    def summary(self) -> dict[str, Any]:
        """Parameters and FLOPs per level, and the mean model size relative to the global model
        (Table 1's Ratio) over the mix's proportions, or over the clients dealt each level."""
        levels = {}
        for level, variant in zip(self.levels, self.variants):
            cost = self.context.cost_of(variant)
            levels[level.name] = {
                "rate": level.rate,
                "params": cost.num_params,
                "forward_flops": cost.forward_flops,
                "train_flops": cost.train_flops,
            }
        # Weights: the mix's proportions (dynamic), or the clients actually dealt each level.
        share = (
            [l.proportion for l in self.levels]
            if self.fixed is None
            else [int((self.fixed == k).sum()) for k in range(len(self.levels))]
        )
        mean = lambda key: sum(levels[l.name][key] * w for l, w in zip(self.levels, share)) / sum(share)  # noqa: E731
        return {
            "levels": levels,
            "mean_params": mean("params"),
            "mean_forward_flops": mean("forward_flops"),
            "model_size_ratio": mean("params") / levels[self.levels[0].name]["params"],
        }


def static_bn(models: ModelCache, variant: ModelConfig, weights: Weights, calibrate: Sequence[np.ndarray]) -> nn.Module:
    """Sec. 3.2's static BN before evaluation: the variant with batch norm that tracks statistics
    (and no Scaler), loaded with `weights`, its running statistics recomputed as the cumulative
    average over the `calibrate` batches of training inputs (every batch weighs the same)."""
    model = models.load(variant.model_copy(update={"norm": "bn", "scaler": 1.0}), weights, strict=False)
    for bn in (m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)):
        bn.momentum = None  # cumulative moving average
        bn.reset_running_stats()
    model.train()
    with torch.no_grad():
        for x in calibrate:
            model(torch.from_numpy(x))
    return model


def masked_logits(logits: torch.Tensor, mask: torch.Tensor, fill: str) -> torch.Tensor:
    """Logits of classes outside the label split set to 0 (public code) or -inf; `none` keeps them."""
    if fill == "none":
        return logits
    return logits.masked_fill(~mask, 0.0 if fill == "zero" else float("-inf"))


def _classifier_keys(shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """The last layer's weight and bias: the keys whose rows are classes."""
    names = [k for k in shapes if k.endswith(".weight") or k.endswith(".bias")]
    last = names[-1].rsplit(".", 1)[0]
    return [k for k in names if k.rsplit(".", 1)[0] == last]


class HeteroFLClient(FedAvgClient):
    """Local SGD on the sub-model with the masked cross-entropy of Sec. 3.2."""

    def loss_inputs(self, task: HeteroFLTask, model: nn.Module) -> dict[str, torch.Tensor]:
        """The client's label split as a class mask, on the model's device."""
        mask = torch.zeros(model_classes(model), dtype=torch.bool)
        mask[list(task.label_split)] = True
        return {"mask": mask.to(next(model.parameters()).device)}

    def data_loss(
        self, logits: torch.Tensor, y: torch.Tensor, inputs: Mapping[str, torch.Tensor], reduction: str = "mean"
    ) -> torch.Tensor:
        """Sec. 3.2's masked cross-entropy (a mask per client when vectorized: clients of one
        width train together, `ray.vectorize`)."""
        return cross_entropy(masked_logits(logits, inputs["mask"], self.config.algorithm.mask), y, reduction)


def model_classes(model: nn.Module) -> int:
    return [m for m in model.modules() if isinstance(m, nn.Linear)][-1].out_features


HETEROFL = register(
    Algorithm(
        "heterofl",
        "HeteroFL (Diao et al. 2021): nested width sub-models, per-entry aggregation",
        HeteroFLConfig,
        HeteroFLPolicy,
        HeteroFLClient,
        vectorizable=True,
        sync_only=None,
    )
)


# Baselines of the paper (Tables 1-3), under the same machinery (Scaler, masking, static BN,
# per-level metrics): FedAvg's weights, one level, dealt as the baseline asks.
class AllLargeConfig(HeteroFLConfig):
    """AllLarge: every client trains the largest model, ignoring memory budgets."""

    name: str = "alllarge"
    levels: Literal["a1"] = "a1"
    mode: Literal["fix"] = "fix"
    weighting: Literal["count", "samples"] = "samples"


class AllSmallConfig(HeteroFLConfig):
    """AllSmall: every client trains the smallest model, so every device fits."""

    name: str = "allsmall"
    levels: str = Field("e1", pattern=r"^[a-e]1$", description="the one level, e.g. e1")
    mode: Literal["fix"] = "fix"
    weighting: Literal["count", "samples"] = "samples"


class ExclusiveFLConfig(HeteroFLConfig):
    """ExclusiveFL: only the clients whose device fits the largest model train."""

    name: str = "exclusivefl"
    levels: Literal["a1"] = "a1"
    mode: Literal["capability"] = "capability"
    weighting: Literal["count", "samples"] = "samples"


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
            vectorizable=True,
            sync_only=None,
        )
    )

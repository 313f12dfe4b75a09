"""HeteroFL's server policy: levels dealt, sub-models extracted (`aggregate.extract`), every entry
averaged over the clients that hold it (Sec. 3.1), and static BN before evaluation (Sec. 3.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ... import rng
from ...config import ConfigError, ModelConfig, RunConfig
from ...data import Clients
from ...evaluate import Evaluator, scores
from ...models import ModelCache, build_model
from ...models.layers import ScaledConfig
from ...types import ClientId, Round, Weights
from .. import aggregate
from ..base import ServerPolicy
from ..budget import client_rates
from ..messages import ClientResult, ClientTask, FederationContext, ServerState
from .levels import assign_capability, assign_fix, budget_levels, matched_levels, parse_levels


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
                f"model.name: {config.algorithm.name} needs a width-scalable model with a Scaler (cnn, mlp, cnn1d, "
                "preresnet18)"
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
                    f"algorithm.levels: mode class needs one level per device class ({len(classes)} in profile "
                    f"{config.devices.profile!r}), not {len(self.levels)}"
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
            rate = self.levels[int(self.fixed[0])].rate
            return f"every client's memory budget fits the same level ({rate:g} of the width)"
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
        tasks, submodels = [], {}
        for c in clients:
            k = self.level_of(round, c)
            if k not in submodels:  # one dict per level: it crosses to a client's device once a call
                submodels[k] = aggregate.extract(state.weights, self.shapes[k])
            weights = submodels[k]
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
        mean = lambda key: sum(levels[l.name][key] * w for l, w in zip(self.levels, share)) / sum(share)
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

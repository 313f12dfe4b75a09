"""FedSup's and E-FedSup's server: the supernet broadcast (FedSup) or one tier sub-net per client
(E-FedSup, Sec. 3.4), aggregated by sample share (Alg. 1 l. 13) or filled with the broadcast values
(Sec. 3.5), and the Big, Medium and Small children evaluated."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ... import rng
from ...config import ConfigError, ModelConfig, RunConfig
from ...devices.cost import nbytes
from ...models import build_model
from ...models.supernet import Subnet, SupernetConfig, crop, largest, medium, random_subnet, smallest
from ...types import ClientId, Round, Weights
from .. import aggregate
from ..base import ServerPolicy, head_scores
from ..local import epoch_batches
from ..messages import ClientResult, ClientTask, FederationContext, ServerState
from .client import FedSupTask, step_subnets
from .costs import SubnetCosts


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
                list(cfg.tier_budgets)
                if cfg.tier_budgets is not None
                else [1.0]
                if len(classes) == 1  # one class is the strongest too: the whole space, never the smallest only
                else list(np.linspace(lo, 1.0, len(classes)))
            )
            if len(self.budgets) != len(classes):
                raise ConfigError(
                    f"algorithm.tier_budgets: {len(self.budgets)} budgets for the {len(classes)} device classes of "
                    f"profile {config.devices.profile!r}"
                )

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        if not isinstance(config.model, SupernetConfig):
            raise ConfigError(
                f"model.name: {config.algorithm.name} trains a supernet (supernet, supernet_small), not "
                f"{config.model.name}"
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
            aggregate.WEIGHT: float(n),
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

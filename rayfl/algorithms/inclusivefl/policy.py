"""InclusiveFL's server (Algorithm 1): depth groups dealt by device class, homomorphic and
layer-wise heterogeneous aggregation, momentum distillation; the pure functions over name-keyed
arrays first, then the policy (the package's docstring has the paper's steps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ...config import ConfigError, ModelConfig, RunConfig
from ...devices import configured_profile
from ...devices.profile import DeviceClass
from ...models import build_model
from ...models.layers import DepthConfig, is_head, layer_of
from ...statetypes import state_type
from ...types import ClientId, Round, Weights
from .. import aggregate, server_opt
from ..base import ServerPolicy
from ..messages import ClientResult, ClientTask, FederationContext, ServerState
from .config import DepthBaselineConfig, parse_depths


@dataclass(frozen=True)
class Group:
    name: str
    depth: int
    classes: tuple[int, ...]
    """The device classes whose clients train this group's model."""


@state_type
@dataclass(frozen=True)
class GroupState:
    """A group's server-side state between rounds."""

    own: dict[str, np.ndarray]
    """Its top layer and head (the largest group's live in the global weights)."""
    opt: server_opt.ServerOptState
    """Its server optimizer over its sub-global model's parameters."""
    momentum: dict[str, np.ndarray] | None
    """m^j: its mean update over layers L^- .. L_j, by name relative to the layer (None for the smallest)."""


# --------------------------------------------------------------------------- pure functions
# Over name-keyed arrays; `prefix` is the model family's layer prefix, depths are 1-based
# layer counts weakest first, layer indices are 0-based (layer l of the paper is index l - 1).


def sharers(key: str, depths: Sequence[int], prefix: str) -> list[int]:
    """The groups whose shared module theta^j holds `key` (Alg. 1 l. 26-27): the stem for all,
    layer index l for the groups with l < L_j - 1 (their top layer L_j is isolated), the head
    for none."""
    if is_head(key):
        return []
    where = layer_of(key, prefix)
    return [j for j, d in enumerate(depths) if where is None or where[0] < d - 1]


def heterogeneous(
    old: Weights, new: Mapping[int, Weights], shares: Mapping[int, float], depths: Sequence[int], prefix: str
) -> dict[str, np.ndarray]:
    """Alg. 1 l. 26-28: each tensor of the largest model is the average of the updated values of
    the round's groups that share it, weighted by their shares renormalised over those groups;
    a tensor no present group shares (the largest group's top layer and head, layers only it
    holds) takes the largest group's updated value, or keeps `old` when it sat the round out."""
    largest = len(depths) - 1
    out = {}
    for key, value in old.items():
        holders = [j for j in sharers(key, depths, prefix) if j in new]
        if holders:
            total = sum(shares[j] for j in holders)
            mean = sum(shares[j] / total * np.asarray(new[j][key], np.float64) for j in holders)
            out[key] = aggregate.merge({key: value}, {key: mean})[key]
        else:
            out[key] = new[largest][key] if largest in new else value
    return out


def distill(
    update: Mapping[str, np.ndarray], momentum: Mapping[str, np.ndarray], top: int, beta: float, prefix: str
) -> dict[str, np.ndarray]:
    """Alg. 1 l. 17: g^{j,L_j} <- beta m^k_{t-1} + (1 - beta) g^{j,L_j} for every tensor of the
    top layer (index `top`), matched to the momentum by its name relative to the layer."""
    out = dict(update)
    for key, g in update.items():
        where = layer_of(key, prefix)
        if where and where[0] == top:
            out[key] = beta * momentum[where[1]] + (1 - beta) * np.asarray(g, np.float64)
    return out


def momentum_of(update: Mapping[str, np.ndarray], first: int, last: int, prefix: str) -> dict[str, np.ndarray]:
    """Alg. 1 l. 22: m^j = 1 / (L_j - L^- + 1) sum_{l = L^-}^{L_j} g^{j,l}: the mean of the
    update over layer indices `first` .. `last` (inclusive), by name relative to the layer. New
    arrays: nothing aliases the update (the public code's cached gradients are zeroed in place)."""
    out: dict[str, np.ndarray] = {}
    for key, g in update.items():
        where = layer_of(key, prefix)
        if where and first <= where[0] <= last:
            out[where[1]] = out.get(where[1], 0.0) + np.asarray(g, np.float64)
    return {rel: v / (last - first + 1) for rel, v in out.items()}


# --------------------------------------------------------------------------- the policy


class InclusiveFLPolicy(ServerPolicy):
    """Depth groups with their own top layers, heads, server optimizers and momenta. The depth
    baselines (`alllarge_depth`, ...) are the same policy with one group (`plan`)."""

    def __init__(self, config: RunConfig, context: FederationContext):
        super().__init__(config, context)
        self.groups = self.plan(config, context.classes("InclusiveFL's depth groups"))
        self.depths = [g.depth for g in self.groups]
        self.variants = [config.model.model_copy(update={"depth": g.depth}) for g in self.groups]
        self.keys = [list(build_model(v, context.input_shape, context.num_classes).state_dict()) for v in self.variants]
        self.prefix = type(config.model).layer_prefix
        of_class = {c: j for j, g in enumerate(self.groups) for c in g.classes}
        self.class_group = np.array(
            [of_class.get(i, -1) for i in range(len(context.classes("InclusiveFL's depth groups")))]
        )
        self.grouped = self.class_group[context.device_classes] >= 0
        """(num_clients,) whether a client's device class has a group (ExclusiveFL: the strongest only)."""

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        if not isinstance(config.model, DepthConfig):
            raise ConfigError(
                f"model.name: {config.algorithm.name} needs a depth-sliceable model (transformer, resstack, hf_encoder)"
            )
        depths = parse_depths(config.algorithm.depths)
        if max(depths) != config.model.depth:
            raise ConfigError(
                f"algorithm.depths: the largest depth ({max(depths)}) must be model.depth ({config.model.depth})"
            )
        groups = cls.plan(config, configured_profile(config.devices).classes)
        lrs = config.algorithm.server_lrs
        if lrs is not None and len(lrs) != len(groups):
            raise ConfigError(f"algorithm.server_lrs: {len(lrs)} rates for {len(groups)} depth groups")

    @classmethod
    def plan(cls, config: RunConfig, classes: Sequence[DeviceClass]) -> list[Group]:
        """InclusiveFL: one group per device class, weakest first (the paper's weak / medium /
        strong). A baseline: one group, every class (AllLarge at the largest depth, AllSmall at
        the smallest) or the strongest class only (ExclusiveFL at the largest depth)."""
        depths = parse_depths(config.algorithm.depths)
        baseline = config.algorithm.baseline if isinstance(config.algorithm, DepthBaselineConfig) else None
        everyone = tuple(range(len(classes)))
        if baseline == "alllarge":
            return [Group("all", max(depths), everyone)]
        if baseline == "allsmall":
            return [Group("all", min(depths), everyone)]
        if baseline == "exclusivefl":
            return [Group(classes[-1].name, max(depths), (len(classes) - 1,))]
        if len(depths) != len(classes):
            raise ConfigError(
                f"algorithm.depths: {len(depths)} depths for the {len(classes)} device classes of profile "
                f"{config.devices.profile!r}"
            )
        return [Group(c.name, d, (i,)) for i, (c, d) in enumerate(zip(classes, depths))]

    # ----------------------------------------------------------------------- structure

    def group_of(self, client: ClientId) -> int:
        """The client's group (-1: its device class has none)."""
        return int(self.class_group[self.context.device_classes[client]])

    def top_keys(self, j: int) -> list[str]:
        """Group j's isolated module f^j: its top layer (L_j) and its head."""
        return [k for k in self.keys[j] if j not in sharers(k, self.depths, self.prefix)]

    def global_model(self) -> ModelConfig:
        return self.variants[-1]

    def submodel(self, state: ServerState, j: int) -> dict[str, np.ndarray]:
        """Group j's sub-global model w^j: the global bottom with its own top layer and head (l. 28-29)."""
        own = state.opt_state[j].own
        return {k: own[k] if k in own else state.weights[k] for k in self.keys[j]}

    def params(self, j: int) -> list[str]:
        return [k for k in self.keys[j] if k in self.context.param_names]

    def init_state(self, weights: Weights) -> ServerState:
        """Alg. 1 l. 1-3: the largest model initialised; each group's bottom, top layer and head
        taken from it; momenta at 0."""
        first_layer = {
            where[1]: np.shape(v) for k, v in weights.items() if (where := layer_of(k, self.prefix)) and where[0] == 0
        }
        largest = len(self.groups) - 1
        groups = []
        for j in range(len(self.groups)):
            own = {k: np.array(weights[k]) for k in self.top_keys(j)} if j < largest else {}
            momentum = {rel: np.zeros(shape) for rel, shape in first_layer.items()} if j > 0 else None
            groups.append(GroupState(own, self.opt_init(j, {k: weights[k] for k in self.params(j)}), momentum))
        return ServerState(round=0, weights=dict(weights), opt_state=tuple(groups))

    def opt_init(self, j: int, params: Weights) -> server_opt.ServerOptState:
        cfg = self.config.algorithm
        if cfg.server_opt == "avg":
            return server_opt.init("sgd", params, eta=1.0, beta1=0.0)
        eta = cfg.server_lrs[j] if cfg.server_lrs else cfg.server_lr
        return server_opt.init("adam", params, eta=eta, beta1=cfg.beta1, beta2=cfg.beta2, tau=cfg.tau)

    # ----------------------------------------------------------------------- the round

    def eligible(self, round: Round) -> np.ndarray:
        return self.grouped

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        subs: dict[int, dict[str, np.ndarray]] = {}
        tasks = []
        for c in clients:
            j = self.group_of(c)
            if j not in subs:
                subs[j] = self.submodel(state, j)
            tasks.append(self.task(c, round, subs[j], model=self.variants[j]))
        return tasks

    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """The client's share of its group's mean (l. 14): n_k w_k and n_k (or w_k and 1 with
        `group_weighting: users`), keyed `<group>/<name>`."""
        weight = 1.0 if self.config.algorithm.group_weighting == "users" else result.num_examples
        return {
            f"{self.group_of(result.client_id)}/{k}": v
            for k, v in aggregate.weighted_sum(result.weights, weight).items()
        }

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """Alg. 1 l. 8-29 for the groups that had clients this round; a group that sat the round
        out keeps its top layer, head, optimizer and momentum."""
        if not total:
            return state.replace(round=round)
        largest = len(self.groups) - 1
        groups, new, shares = list(state.opt_state), {}, {}
        for j in range(len(self.groups)):
            part = {k.split("/", 1)[1]: v for k, v in total.items() if k.startswith(f"{j}/")}
            if not part:
                continue
            sub = self.submodel(state, j)
            mean = aggregate.mean_of(part, sub)
            update = aggregate.difference(mean, sub, self.params(j))  # l. 14: g^j
            if j < largest:  # l. 15-18 (several groups: InclusiveFL, whose config has beta)
                update = distill(
                    update, state.opt_state[j + 1].momentum, self.depths[j] - 1, self.config.algorithm.beta, self.prefix
                )
            opt, params = server_opt.apply(state.opt_state[j].opt, sub, update)  # l. 19
            new[j] = aggregate.merge(mean, params)  # buffers take the group's mean
            shares[j] = float(part[aggregate.WEIGHT])
            momentum = (
                momentum_of(update, self.depths[j - 1] - 1, self.depths[j] - 1, self.prefix) if j > 0 else None
            )  # l. 20-23
            groups[j] = GroupState({k: new[j][k] for k in self.top_keys(j)} if j < largest else {}, opt, momentum)
        weights = heterogeneous(state.weights, new, shares, self.depths, self.prefix)
        return state.replace(round=round, weights=weights, opt_state=tuple(groups))

    # ----------------------------------------------------------------------- evaluation

    def evaluate(self, state: ServerState, round: Round, evaluator) -> dict[str, float]:
        """The global (largest) model's metrics, and `test_accuracy@<group>` of every sub-global
        model when there are several."""
        out: dict[str, float] = {}
        for j, (group, variant) in enumerate(zip(self.groups, self.variants)):
            scores = evaluator(self.submodel(state, j), variant)
            if j == len(self.groups) - 1:
                out.update(test_accuracy=scores["accuracy"], test_loss=scores["loss"])
            if len(self.groups) > 1:
                out[f"test_accuracy@{group.name}"] = scores["accuracy"]
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "groups": {
                g.name: {"depth": g.depth, "params": self.context.cost_of(v).num_params}
                for g, v in zip(self.groups, self.variants)
            }
        }

"""Split learning as a server-in-the-loop round (`exchange`): the top model drives, bottoms answer.

A model is cut at a split point into a bottom (on the worker) and a top (on the parameter
server) by `rayfl.models.layers.split`. Per iteration each worker i forwards a batch of d_i
samples through its bottom model and sends the features (`SplitSession.forward`); the server
(`TopServer`, the round's driver) either merges all features into one sequence and takes one
top-model step on it (MergeSFL, Sec. IV-C "feature merging"), or takes one top step per worker
on its own features (typical SFL: SplitFed / LocFedMix-SL style); each worker gets the gradient
of its features back and steps its bottom model (`SplitSession.backward`). Both halves build
their optimizers from the task's `OptimizerSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import rng
from ..config import ConfigError, RunConfig
from ..devices.cost import measure, nbytes
from ..models import build_model, families, to_numpy, to_torch
from ..models.layers import SplitConfig, split
from ..optim import OptimizerSpec
from ..types import Round, Weights
from . import aggregate
from .base import ClientProcedure, ServerPolicy
from .exchange import ClientSession, Relay, RoundDriver
from .local import ClientContext, ClientData
from .messages import ClientResult, ClientTask, FederationContext, ServerState


def merged_step(
    top: nn.Module, optimizer: torch.optim.Optimizer, features: Sequence[torch.Tensor], labels: Sequence[torch.Tensor]
) -> tuple[float, list[torch.Tensor]]:
    """Feature merging and gradient dispatching: one top step on the merged sequence of
    D = sum_i d_i samples (its mean loss), then the merged feature gradient is cut back into the
    workers' pieces and each is multiplied by D / d_i, so worker i receives the gradient of its
    *own* mean loss (docs/papers.md, MergeSFL: public code, feature merging and gradient
    splitting). Returns (merged loss, per-worker gradients)."""
    sizes = [len(f) for f in features]
    merged = torch.cat([f.detach() for f in features]).requires_grad_(True)
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(top(merged), torch.cat(list(labels)))
    loss.backward()
    optimizer.step()
    total = sum(sizes)
    grads = [g * (total / n) for g, n in zip(merged.grad.split(sizes), sizes)]
    return float(loss.detach()), grads


def unmerged_steps(
    top: nn.Module,
    optimizer: torch.optim.Optimizer,
    features: Sequence[torch.Tensor],
    labels: Sequence[torch.Tensor],
    lrs: Sequence[float] | None = None,
) -> tuple[list[float], list[torch.Tensor]]:
    """Typical SFL: one top step per worker, in worker order, each on that worker's mean loss
    (at `lrs[i]` when given). Returns (the workers' losses, per-worker feature gradients)."""
    losses, grads = [], []
    for i, (f, y) in enumerate(zip(features, labels)):
        if lrs is not None:
            for group in optimizer.param_groups:
                group["lr"] = lrs[i]
        x = f.detach().requires_grad_(True)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(top(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        grads.append(x.grad)
    return losses, grads


def bottom_step(optimizer: torch.optim.Optimizer, features: torch.Tensor, grad: torch.Tensor) -> None:
    """Back-propagate the server's feature gradient through the bottom model and step it."""
    optimizer.zero_grad(set_to_none=True)
    features.backward(grad)
    optimizer.step()


@dataclass(frozen=True, kw_only=True)
class SplitTask(ClientTask):
    """A split-learning task: `weights` are the bottom model's; `tau` iterations of `batch_size`."""

    tau: int = 1


class SplitSession(ClientSession):
    """One worker's bottom model for one round: forward a batch, take the server's gradient, repeat."""

    def __init__(self, task: SplitTask, bottom: nn.Module, data: ClientData, seed: int):
        self.task, self.bottom, self.data = task, bottom, data
        self.optimizer = task.optimizer.build(bottom.parameters())
        self.g = rng.generator(seed, "batches", task.round, task.client_id)
        self.queue: list[np.ndarray] = []
        self.features: torch.Tensor | None = None
        self.losses: list[float] = []

    def next_batch(self) -> np.ndarray:
        """Batches of d_i from seeded permutations, cycling over epochs; the last partial one dropped."""
        if not self.queue:
            n, d = len(self.data), min(self.task.batch_size, len(self.data))
            order = self.g.permutation(n)
            self.queue = [order[i : i + d] for i in range(0, n - d + 1, d)]
        return self.queue.pop(0)

    def forward(self) -> tuple[np.ndarray, np.ndarray]:
        """The next batch's features (float32) and labels (int64)."""
        x, y = self.data.batch(torch.from_numpy(self.next_batch()).to(self.data.y.device))
        self.bottom.train()
        self.features = self.bottom(x)
        return self.features.detach().cpu().numpy(), y.cpu().numpy()

    def backward(self, grad: np.ndarray, loss: float) -> None:
        """Step the bottom model with the server's gradient of the features."""
        bottom_step(self.optimizer, self.features, torch.from_numpy(np.array(grad)).to(self.features.device))
        self.features = None
        self.losses.append(loss)

    def close(self) -> ClientResult:
        samples = self.task.tau * min(self.task.batch_size, len(self.data))
        return ClientResult.of(
            self.task,
            weights=to_numpy(self.bottom),
            num_examples=len(self.data),
            num_samples=samples,
            train_loss=float(np.mean(self.losses)),
        )


class SplitClient(ClientProcedure):
    """The worker side of split learning: it trains only inside the server's exchange."""

    def open_session(self, task: SplitTask, data: ClientData, ctx: ClientContext) -> SplitSession:
        bottom = split(ctx.models.build(task.model), task.model.split_layer)[0]
        bottom.load_state_dict(to_torch(task.weights))
        return SplitSession(task, bottom, data, ctx.seed)

    def run(self, task: ClientTask, data: ClientData, ctx: ClientContext) -> ClientResult:
        raise NotImplementedError("a split-learning worker trains only in its server's exchange (open_session)")


class TopServer(RoundDriver):
    """The top model on the coordinator for one round, driving `tau` iterations: merged or
    per-worker steps. `lrs` gives the merged step's rate (one value) or each worker's step's
    rate (one per worker, in order); the rest of the optimizer comes from `optimizer`."""

    def __init__(
        self,
        top: nn.Module,
        optimizer: OptimizerSpec,
        lrs: Sequence[float],
        merge: bool,
        seed: int,
        round: Round,
        tau: int = 1,
    ):
        self.top = top.train()
        self.optimizer = optimizer.build(top.parameters())
        self.lrs = list(lrs)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lrs[0]
        self.merge = merge
        self.tau = tau
        self.seed, self.round, self.iteration = seed, round, 0

    def drive(self, clients: Relay) -> None:
        """tau iterations: every worker's features up, one server step, every gradient down."""
        for _ in range(self.tau):
            outs = clients.call("forward")
            features = [torch.from_numpy(np.array(f)) for f, _ in outs]
            labels = [torch.from_numpy(np.array(y)) for _, y in outs]
            losses, grads = self.step(features, labels)
            clients.post("backward", [(g.numpy(), loss) for g, loss in zip(grads, losses)])

    def step(
        self, features: Sequence[torch.Tensor], labels: Sequence[torch.Tensor]
    ) -> tuple[list[float], list[torch.Tensor]]:
        """One iteration: (each worker's loss, each worker's feature gradient). The top model's
        random draws (dropout) are keyed by (seed, round, iteration)."""
        self.iteration += 1
        with rng.seeded_torch(self.seed, "top-model", self.round, self.iteration):
            if self.merge:
                loss, grads = merged_step(self.top, self.optimizer, features, labels)
                return [loss] * len(grads), grads
            return unmerged_steps(
                self.top, self.optimizer, features, labels, self.lrs if len(self.lrs) == len(features) else None
            )

    def weights(self) -> dict[str, np.ndarray]:
        return to_numpy(self.top)

    def finish(self, state: ServerState) -> ServerState:
        """The trained top model replaces its part of the global weights."""
        return state.replace(weights=aggregate.merge(state.weights, self.weights()))


class SplitPolicy(ServerPolicy):
    """Server half of split-learning algorithms: each round opens a `TopServer` that drives
    the workers' `SplitSession`s. Subclasses say how the round's top steps are paced (`top_lrs`)."""

    def __init__(self, config: RunConfig, context: FederationContext):
        super().__init__(config, context)
        if not isinstance(config.model, SplitConfig):
            splittable = sorted(n for n, f in families().items() if issubclass(f.config_class, SplitConfig))
            raise ConfigError(
                f"model.name: {config.algorithm.name} needs a model with a split point ({', '.join(splittable)})"
            )
        bottom, top = split(
            build_model(config.model, context.input_shape, context.num_classes), config.model.split_layer
        )
        self.bottom_keys = list(bottom.state_dict())
        self.top_keys = list(top.state_dict())
        probe = torch.zeros(2, *context.input_shape)
        with torch.no_grad():
            self.feature_bytes = int(bottom.eval()(probe)[0].numel() * 4)
        self.bottom_flops = measure(bottom, context.input_shape).train_flops

    @classmethod
    def check_config(cls, config: RunConfig) -> None:
        if config.federation.local_epochs != 1:
            raise ConfigError(
                f"federation.local_epochs: {config.algorithm.name} trains algorithm.tau iterations a round, not "
                "epochs; leave it at 1"
            )

    def eligible(self, round: Round) -> np.ndarray:
        """The workers with samples to train (an exchange needs every session's batches)."""
        return np.asarray(self.context.num_examples) > 0

    def bottom(self, weights: Weights) -> dict[str, np.ndarray]:
        """The bottom model's part of the global weights (what a worker receives)."""
        return {k: weights[k] for k in self.bottom_keys}

    def top_lrs(self, round: Round, tasks: Sequence[SplitTask]) -> list[float]:
        """The top model's learning rate(s) for the round: the round's rate for every step."""
        return [self.lr(round)]

    def open_driver(self, state: ServerState, round: Round, tasks: Sequence[SplitTask]) -> TopServer:
        """The round's top model, knowing the round's tasks (their batch sizes)."""
        model = build_model(self.config.model, self.context.input_shape, self.context.num_classes)
        model.load_state_dict(to_torch(state.weights))
        top = split(model, self.config.model.split_layer)[1]
        cfg = self.config.algorithm
        return TopServer(
            top,
            self.optimizer(round),
            self.top_lrs(round, tasks),
            cfg.merge_features,
            self.context.seed,
            round,
            cfg.tau,
        )

    def client_cost(self, task: ClientTask, result: ClientResult) -> tuple[float, int, int]:
        """Bottom FLOPs; down: the bottom model and every iteration's feature gradients; up: the
        bottom model and every iteration's features and labels (float32, int64)."""
        exchanged = result.num_samples
        down = nbytes(task.weights) + exchanged * self.feature_bytes
        up = nbytes(result.weights) + exchanged * (self.feature_bytes + 8)
        return self.bottom_flops * exchanged, down, up

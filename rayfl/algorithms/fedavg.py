"""FedAvg: "Communication-Efficient Learning of Deep Networks from Decentralized Data",
McMahan, Moore, Ramage, Hampson, Agüera y Arcas, AISTATS 2017 (arXiv:1602.05629).

Server: x_{t+1} = x_t + eta * Delta_t with Delta_t = sum_k (n_k / n) (x_k - x_t) over the
round's clients (Alg. 1, written as a server-optimizer step; eta = 1 is plain FedAvg, and
`server_momentum` > 0 gives FedAvgM). Buffers (batch-norm statistics) take the weighted mean.
Client: E epochs of minibatch SGD on the cross-entropy loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..config import AlgorithmConfig
from ..types import Round, Weights
from . import aggregate, server_opt
from .base import ClientProcedure, ServerPolicy
from .local import Batch, ClientContext, ClientData, LocalState
from .messages import ClientFailure, ClientResult, ClientTask, ServerState
from .registry import Algorithm, register
from .vectorize import train_vectorized


class FedAvgConfig(AlgorithmConfig):
    name: str = "fedavg"
    server_lr: float = Field(1.0, gt=0, description="server learning rate eta (1 = plain FedAvg)")
    server_momentum: float = Field(0.0, ge=0, lt=1, description="server momentum beta (FedAvgM when > 0)")


class FedAvgPolicy(ServerPolicy):
    """FedAvg's server half; subclasses change the server optimizer (`opt_init`)."""

    def opt_init(self, params: Weights) -> server_opt.ServerOptState:
        cfg = self.config.algorithm
        return server_opt.init("sgd", params, eta=cfg.server_lr, beta1=cfg.server_momentum)

    def init_state(self, weights: Weights) -> ServerState:
        params = {k: v for k, v in weights.items() if k in self.context.param_names}
        return ServerState(round=0, weights=dict(weights), opt_state=self.opt_init(params))

    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """n_k x_k and n_k (Alg. 1 l.9's weighted sum)."""
        return aggregate.weighted_sum(result.weights, result.num_examples)

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """Alg. 1 l.9: x_{t+1} <- x_t + eta * sum_k (n_k / n)(x_k - x_t)."""
        if not results:
            return state.replace(round=round)
        mean = aggregate.mean_of(total, state.weights)
        params = [k for k in state.weights if k in self.context.param_names]
        delta = aggregate.difference(mean, state.weights, params)
        opt_state, new_params = server_opt.apply(state.opt_state, state.weights, delta)
        weights = aggregate.merge(state.weights, {**mean, **new_params})
        return state.replace(round=round, weights=weights, opt_state=opt_state)


@dataclass(frozen=True)
class Objective:
    """What a client's loss reads besides its batch: the per-client tensors of its data term
    (`FedAvgClient.loss_inputs`) and, when the procedure has a `penalty`, the initial
    parameters w^t it pulls towards."""

    inputs: Mapping[str, torch.Tensor]
    anchor: Mapping[str, torch.Tensor] | None


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over any leading dimensions of `logits` (..., C) and `y` (...): one batch's
    mean, or (`none`) a loss per sample in `y`'s shape (K clients' padded batches at once)."""
    if y.dim() == 1:  # one batch
        return F.cross_entropy(logits, y, reduction=reduction)
    out = F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction=reduction)
    return out if reduction == "mean" else out.view(y.shape)


class FedAvgClient(ClientProcedure):
    """Local minibatch training with the task's optimizer (SGD by default) on one objective:
    the data term `data_loss` (cross-entropy) plus, when a subclass defines one, a `penalty`
    over the parameters (FedProx's Eq. 2). The sequential `step` and the vectorized computation
    (`run_vectorized`, for algorithms registered `vectorizable`) both call these, so an
    objective is written once."""

    penalty: Callable[..., torch.Tensor] | None = None
    """`penalty(params, anchor, *, batched)`: a term over the parameters and their initial values,
    a scalar, or (K,) for K stacked clients (`batched`); None: the data term alone."""

    def loss_inputs(self, task: ClientTask, model: nn.Module) -> dict[str, np.ndarray]:
        """Per-client arrays the data term reads as tensors (HeteroFL's label mask), built on the
        host: moved to the device per client, or stacked over the clients of a vectorized call
        and moved once."""
        return {}

    def data_loss(
        self, logits: torch.Tensor, y: torch.Tensor, inputs: Mapping[str, torch.Tensor], reduction: str = "mean"
    ) -> torch.Tensor:
        """The data term: `cross_entropy` (its reduction as asked). Vectorized, short batches are
        padded with samples labelled `vectorize.IGNORED` (cross-entropy's `ignore_index`), whose
        loss must come out 0: a data term of its own honours that label."""
        return cross_entropy(logits, y, reduction)

    def run_vectorized(
        self, tasks: Sequence[ClientTask], datas: Sequence[ClientData], ctx: ClientContext
    ) -> list[ClientResult | ClientFailure]:
        """K clients' local epochs in one batched computation (`vectorize.train_vectorized`)."""
        return train_vectorized(self, tasks, datas, ctx)

    def load(self, task: ClientTask, ctx: ClientContext) -> nn.Module:
        """The module the client trains, loaded with the task's weights."""
        return ctx.load(task.model, task.weights)

    def init(self, task: ClientTask, ctx: ClientContext) -> LocalState:
        model = self.load(task, ctx)
        if not model.training:  # the cached module stays in training mode between clients
            model.train()
        anchor = (
            {n: p.detach().clone() for n, p in model.named_parameters()} if self.penalty is not None else None
        )  # w^t
        inputs = {k: torch.from_numpy(v).to(ctx.device) for k, v in self.loss_inputs(task, model).items()}
        return LocalState(model, ctx.optimizer(task.optimizer, model), Objective(inputs, anchor))

    def loss(self, state: LocalState, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The objective on one batch: the data term, plus the penalty when there is one."""
        loss = self.data_loss(logits, y, state.extras.inputs)
        if self.penalty is not None:
            loss = loss + self.penalty(dict(state.model.named_parameters()), state.extras.anchor, batched=False)
        return loss

    def step(self, state: LocalState, batch: Batch) -> torch.Tensor:
        x, y = batch
        state.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(state, state.model(x), y)
        loss.backward()
        state.optimizer.step()
        return loss.detach()


FEDAVG = register(
    Algorithm(
        "fedavg",
        "FedAvg (McMahan et al. 2017): sample-weighted model averaging",
        FedAvgConfig,
        FedAvgPolicy,
        FedAvgClient,
        vectorizable=True,
        sync_only=None,
    )
)

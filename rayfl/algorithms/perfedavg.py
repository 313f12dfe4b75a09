"""Per-FedAvg: "Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic
Meta-Learning Approach", Fallah, Mokhtari, Ozdaglar, NeurIPS 2020 (arXiv:2002.07948).

Clients minimise the MAML objective F(w) = (1/n) sum_i f_i(w - alpha grad f_i(w)) (Eq. 3) by the
local steps of Alg. 1, each on independent batches D, D', D'' of the client's data:
    w~ = w - alpha grad f(w; D)                                  (the inner step)
    w <- w - beta (I - alpha H(w; D'')) grad f(w~; D')          (the outer step)
Per-FedAvg (FO) drops the Hessian term; Per-FedAvg (HF) estimates H(w; D'') u by the finite
difference (grad f(w + delta u; D'') - grad f(w - delta u; D'')) / (2 delta) (Sec. 5). beta is
the task's rate and the outer step is taken by the task's optimizer (plain SGD by default, as the
paper; momentum, weight decay, clipping and Adam act on the outer gradient). Each local epoch
takes as many steps as FedAvg's (one per batch of D), so a step processes two batches (FO) or
three, the Hessian's twice (HF); `num_samples` counts them all (the virtual clock's compute).
Server: FedAvg (sample-weighted averaging).

Personalization (`personalize`, Per-FedAvg's evaluation): `initial_accuracy` is the global model
on each client's own test data, `personal_accuracy` the global model after one gradient step of
size alpha on one batch of the client's training data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from torch.func import functional_call

from .. import rng
from ..evaluate import Evaluator
from ..types import Round
from .base import ClientProcedure
from .fedavg import FedAvgConfig, FedAvgPolicy
from .local import ClientContext, ClientData, LocalState, Trained
from .messages import ClientTask, ServerState
from .personal import accuracy_stats, own_test_rows, predictions
from .registry import Algorithm, register

Params = dict[str, torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]
"""(inputs, labels): a `local.Batch` unpacks to it."""
PURPOSES = ("batches", "outer", "hessian")
"""The seeded batch streams of D, D' and D'' (D's are FedAvg's)."""


class PerFedAvgConfig(FedAvgConfig):
    name: str = "perfedavg"
    variant: Literal["fo", "hf"] = Field(
        "fo", description="Per-FedAvg (FO): first-order outer step; (HF): with the Hessian-free correction"
    )
    alpha: float = Field(0.01, gt=0, description="inner (personalization) step size alpha")
    delta: float = Field(1e-3, gt=0, description="HF's finite-difference step delta of the Hessian-vector product")


# --------------------------------------------------------------------------- local step


def gradient(model: nn.Module, params: Params, batch: Batch) -> tuple[torch.Tensor, Params]:
    """f(params; batch) (a device tensor) and grad f(params; batch), the cross-entropy of `model`
    run with `params`."""
    x, y = batch
    params = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    loss = F.cross_entropy(functional_call(model, params, (x,)), y)
    return loss.detach(), dict(zip(params, torch.autograd.grad(loss, list(params.values()))))


def inner_step(w: Params, g: Params, alpha: float) -> Params:
    """Alg. 1's inner step: w~ = w - alpha grad f(w; D)."""
    return {n: w[n].detach() - alpha * g[n] for n in w}


def hessian_vector(model: nn.Module, w: Params, u: Params, batch: Batch, delta: float) -> Params:
    """Sec. 5 (HF): H(w; D'') u ~ (grad f(w + delta u; D'') - grad f(w - delta u; D'')) / (2 delta)."""
    _, plus = gradient(model, {n: w[n].detach() + delta * u[n] for n in w}, batch)
    _, minus = gradient(model, {n: w[n].detach() - delta * u[n] for n in w}, batch)
    return {n: (plus[n] - minus[n]) / (2 * delta) for n in w}


def meta_gradient(
    model: nn.Module, batches: Sequence[Batch], alpha: float, delta: float
) -> tuple[torch.Tensor, Params]:
    """The outer step's direction (Alg. 1): grad f(w~; D') (FO, two batches), or
    (I - alpha H(w; D'')) grad f(w~; D') (HF, a third batch); with f(w~; D')."""
    w = dict(model.named_parameters())
    _, g = gradient(model, w, batches[0])
    loss, outer = gradient(model, inner_step(w, g, alpha), batches[1])
    if len(batches) == 3:
        hv = hessian_vector(model, w, outer, batches[2], delta)
        outer = {n: outer[n] - alpha * hv[n] for n in w}
    return loss, outer


def outer_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batches: Sequence[Batch], alpha: float, delta: float
) -> torch.Tensor:
    """One local step of Alg. 1: w <- w - beta x `meta_gradient`, by the task's optimizer at rate
    beta. Returns f(w~; D'), the batch's meta-loss."""
    loss, direction = meta_gradient(model, batches, alpha, delta)
    optimizer.zero_grad(set_to_none=True)
    for n, p in model.named_parameters():
        p.grad = direction[n]
    optimizer.step()
    return loss


def adapt_step(model: nn.Module, batch: Batch, alpha: float) -> None:
    """Per-FedAvg's personalization (Eq. 3's inner step at test time): w <- w - alpha grad f(w; batch)."""
    _, g = gradient(model, dict(model.named_parameters()), batch)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.sub_(alpha * g[n])


@dataclass(frozen=True)
class Streams:
    """One local step's batches of D, D' (and D''); its loss is averaged over D' (`size`)."""

    batches: tuple
    """`local.Batch`es of D, D' (and D'')."""

    @property
    def size(self) -> int:
        return self.batches[1].size


class PerFedAvgClient(ClientProcedure):
    """Alg. 1's local steps over the seeded streams of D, D' (and D'' for HF)."""

    def init(self, task: ClientTask, ctx: ClientContext) -> LocalState:
        model = ctx.load(task.model, task.weights).train()
        return LocalState(model, ctx.optimizer(task.optimizer, model), extras=[0])

    def schedule(self, task: ClientTask, state: LocalState, data: ClientData, ctx: ClientContext) -> Iterator[Streams]:
        hf = self.config.algorithm.variant == "hf"
        streams = [ctx.batches(task, data, purpose=p) for p in PURPOSES[: 3 if hf else 2]]
        for batches in zip(*streams):
            state.extras[0] += sum(b.size for b in batches[2:])  # HF: the second gradient on D''
            yield Streams(batches)

    def step(self, state: LocalState, item: Streams) -> torch.Tensor:
        cfg = self.config.algorithm
        return outer_step(state.model, state.optimizer, item.batches, cfg.alpha, cfg.delta)

    def final(self, task: ClientTask, state: LocalState, ctx: ClientContext) -> Trained:
        """The model's tensors; the compute: every batch drawn, D'' twice under HF."""
        return Trained(ctx.tensors(state.model), num_samples=ctx.samples_drawn + state.extras[0])


# --------------------------------------------------------------------------- server


class PerFedAvgPolicy(FedAvgPolicy):
    """FedAvg's server; personalization is one alpha-step from the global model per client."""

    def personalize(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """The global model (`initial_accuracy`) and it after one step of size alpha on one batch
        of the client's training data, keyed by (seed, "personalize", round, client)
        (`personal_accuracy`), on each client's own test data."""
        variant, y = self.global_model(), evaluator.y
        correct = evaluator.logits(state.weights, variant).argmax(1) == y
        alpha, batch_size = self.config.algorithm.alpha, self.config.federation.batch_size
        initial, personal = [], []
        for c, idx in own_test_rows(self.context, y.numpy()):
            initial.append(float(correct[idx].double().mean()))
            x_train, y_train = evaluator.clients.train(c)
            b = rng.generator(self.context.seed, "personalize", round, c).permutation(len(y_train))[:batch_size]
            model = evaluator.models.load(variant, state.weights).train()
            adapt_step(model, (torch.as_tensor(x_train[b]), torch.as_tensor(y_train[b])), alpha)
            personal.append(
                float((predictions(model, evaluator.x_test[idx], evaluator.batch_size) == y[idx]).double().mean())
            )
        return accuracy_stats(initial, personal)


PERFEDAVG = register(
    Algorithm(
        "perfedavg",
        "Per-FedAvg (Fallah et al. 2020): MAML-style local steps (FO or HF), personalized by one alpha-step",
        PerFedAvgConfig,
        PerFedAvgPolicy,
        PerFedAvgClient,
    )
)

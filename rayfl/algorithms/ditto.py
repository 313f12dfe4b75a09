"""Ditto: "Ditto: Fair and Robust Federated Learning Through Personalization", Li, Hu, Beirami,
Smith, ICML 2021 (arXiv:2012.04221), Algorithm 1 with FedAvg as the global solver.

Global model w: FedAvg's (local SGD from w^t, sample-weighted averaging; `FedAvgPolicy`).
Personal models v_k: each selected client also takes, on the same batches and for the same local
epochs, the steps v_k <- v_k - eta (grad F_k(v_k) + lambda (v_k - w^t)) on Ditto's personal
objective h_k(v_k; w^t) = F_k(v_k) + (lambda / 2) ||v_k - w^t||^2 (Sec. 3, Alg. 1's inner loop),
with w^t the global model it received and eta the task's rate (the task's optimizer, plain SGD
by default as in Alg. 1). v_k stays on the device: the server keeps it in `ServerState.clients`
(initialised from the global model the first time the client is selected), it travels with the
task and comes back in `ClientResult.keep`, never averaged and never counted as sent.

Evaluation: `test_accuracy` is the global model's on the central test set; `personalize` gives
the global model (`initial_accuracy`) and each client's v_k (`personal_accuracy`; a client never
selected holds v_k = w) on the client's own test data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from ..evaluate import Evaluator
from ..types import ClientId, Round, Weights
from .capabilities import train_cost
from .fedavg import FedAvgClient, FedAvgConfig, FedAvgPolicy
from .fedprox import squared_distance
from .local import Batch, ClientContext, LocalState, Trained
from .messages import ClientResult, ClientTask, ServerState
from .personal import accuracy_stats, own_test_rows, predictions
from .registry import Algorithm, register


class DittoConfig(FedAvgConfig):
    name: str = "ditto"
    lam: float = Field(
        0.1,
        ge=0,
        description="Ditto's lambda: weight of the personal models' pull (lambda / 2) ||v_k - w^t||^2 towards the "
        "global model",
    )


@dataclass(frozen=True, kw_only=True)
class DittoTask(ClientTask):
    personal: Weights
    """The client's personal model v_k (it stays on the device: not counted as sent)."""


# --------------------------------------------------------------------------- server


class DittoPolicy(FedAvgPolicy):
    """FedAvg on w; each client's v_k kept in `ServerState.clients[k]` between its rounds."""

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        """Alg. 1: w^t to each selected client, with its v_k (w^t when it has none yet)."""
        return [
            self.task(c, round, state.weights, kind=DittoTask, personal=state.clients.get(c, state.weights))
            for c in clients
        ]

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """FedAvg's w^{t+1}; each client's new v_k kept as it is (never averaged)."""
        new = super().aggregate(state, round, results, total)
        clients = {**state.clients, **{r.client_id: r.keep["personal"] for r in results}}
        return new.replace(clients=clients)

    def client_cost(self, task: ClientTask, result: ClientResult) -> tuple[float, int, int]:
        """Both models trained on every sample: twice FedAvg's FLOPs; bytes of w only (v_k stays)."""
        flops, down, up = train_cost(self.context, task, result)
        return 2 * flops, down, up

    def personalize(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """w (`initial_accuracy`) and v_k (`personal_accuracy`) on each client's own test data."""
        variant, y = self.global_model(), evaluator.y
        correct = evaluator.logits(state.weights, variant).argmax(1) == y
        initial, personal = [], []
        for c, idx in own_test_rows(self.context, y.numpy()):
            initial.append(float(correct[idx].double().mean()))
            if c in state.clients:
                model = evaluator.models.load(variant, state.clients[c])
                personal.append(
                    float((predictions(model, evaluator.x_test[idx], evaluator.batch_size) == y[idx]).double().mean())
                )
            else:
                personal.append(initial[-1])
        return accuracy_stats(initial, personal)


# --------------------------------------------------------------------------- client


def personal_step(v: LocalState, batch: tuple[torch.Tensor, torch.Tensor], lam: float) -> torch.Tensor:
    """Alg. 1's personal step: v_k <- v_k - eta (grad F_k(v_k) + lambda (v_k - w^t)), by the
    optimizer on h_k(v_k; w^t) = F_k(v_k) + (lambda / 2) ||v_k - w^t||^2 (w^t in `v.extras`).
    Returns the batch's h_k (a device tensor)."""
    x, y = batch
    v.optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(v.model(x), y) + lam / 2 * squared_distance(dict(v.model.named_parameters()), v.extras)
    loss.backward()
    v.optimizer.step()
    return loss.detach()


@dataclass
class DittoState(LocalState):
    """FedAvg's local state of w, and v_k's (its extras: w^t)."""

    personal: LocalState | None = None


class DittoClient(FedAvgClient):
    """FedAvg's local SGD on w and Ditto's personal steps on v_k, batch by batch."""

    def init(self, task: DittoTask, ctx: ClientContext) -> DittoState:
        state = super().init(task, ctx)
        personal = ctx.load(task.model, task.personal, slot="personal").train()
        reference = {n: p.detach().clone() for n, p in state.model.named_parameters()}  # w^t
        v = LocalState(personal, ctx.optimizer(task.optimizer, personal, slot="personal"), reference)
        return DittoState(state.model, state.optimizer, state.extras, v)

    def step(self, state: DittoState, batch: Batch) -> dict[str, torch.Tensor]:
        return {
            "loss": super().step(state, batch),
            "personal": personal_step(state.personal, batch, self.config.algorithm.lam),
        }

    def final(self, task: DittoTask, state: DittoState, ctx: ClientContext) -> Trained:
        """w's tensors go up; v_k stays (`keep`); `personal_loss` is v_k's mean h_k."""
        return Trained(
            ctx.tensors(state.model),
            metrics={"personal_loss": lambda losses: losses.mean("personal")},
            keep={"personal": ctx.tensors(state.personal.model)},
        )


DITTO = register(
    Algorithm(
        "ditto",
        "Ditto (Li et al. 2021): FedAvg plus per-client personal models pulled towards it by lambda",
        DittoConfig,
        DittoPolicy,
        DittoClient,
    )
)

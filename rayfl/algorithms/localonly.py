"""Local-only: the no-federation baseline of "Supernet Training for Federated Image Classification
under System Heterogeneity", Kim & Yun (FedSup, arXiv:2206.01366), Table 2.

Every client k trains its own model w_k on its own data only, E epochs of minibatch SGD per
round it is selected (FedAvg's client procedure), and w_k is never averaged: it starts from the
initial weights w_0 when k is first selected and persists in `ServerState.clients[k]`. The server
holds w_k between rounds only so that any executor can train any client (docs/design.md, The
round); it travels as the task's weights and returns as the result's. In reality it never leaves
the device, so a round costs no bytes either way (`client_cost`).

Evaluation: there is no global model. `test_accuracy` / `test_loss` are the mean over the clients
that have trained of their own model on their own test data (`client_test_indices`: their
test split, or the central test samples of their classes); `personal_accuracy` is the same
(with its std over clients, no fine-tuning) and `initial_accuracy` is NaN (Table 2's "-").
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..config import AlgorithmConfig, ModelConfig
from ..evaluate import Evaluator, scores
from ..types import ClientId, Round, Weights
from .base import ServerPolicy
from .capabilities import train_cost
from .fedavg import FedAvgClient
from .messages import ClientResult, ClientTask, FederationContext, ServerState
from .personal import accuracy_stats, client_logits, own_test_rows
from .registry import Algorithm, register


class LocalOnlyConfig(AlgorithmConfig):
    name: str = "localonly"


def own_model_scores(
    models: Mapping[ClientId, Weights], variant: ModelConfig, evaluator: Evaluator, context: FederationContext
) -> list[dict[str, float]]:
    """`scores` (accuracy, loss) of each client's own model on its own test rows, in client-id order."""
    rows = dict(own_test_rows(context, evaluator.y.numpy()))
    return [
        scores(client_logits(evaluator, variant, models[c], rows[c]), evaluator.y[rows[c]])
        for c in sorted(models)
        if c in rows
    ]


def mean_of(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


class LocalOnlyPolicy(ServerPolicy):
    """Keeps each client's model w_k; nothing is ever averaged."""

    def own_model(self, state: ServerState, client: ClientId) -> Weights:
        """w_k, or w_0 for a client never selected before."""
        return state.clients.get(client, state.weights)

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        return [self.task(c, round, self.own_model(state, c)) for c in clients]

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """No averaging: each trained client's w_k replaces its previous one; w_0 stays."""
        clients = {**state.clients, **{r.client_id: r.weights for r in results}}
        return state.replace(round=round, clients=clients)

    def client_cost(self, task: ClientTask, result: ClientResult) -> tuple[float, int, int]:
        """The training FLOPs; no bytes, since w_k stays on the device."""
        flops, _, _ = train_cost(self.context, task, result)
        return flops, 0, 0

    def evaluate(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """Mean over trained clients of their own model on their own test data."""
        own = own_model_scores(state.clients, self.global_model(), evaluator, self.context)
        return {"test_accuracy": mean_of([s["accuracy"] for s in own]), "test_loss": mean_of([s["loss"] for s in own])}

    def personalize(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """`personal_accuracy`: each trained client's own model on its own test data (no
        fine-tuning); `initial_accuracy`: NaN, there is no transmitted model (Table 2's "-")."""
        own = own_model_scores(state.clients, self.global_model(), evaluator, self.context)
        return accuracy_stats([], [s["accuracy"] for s in own])


LOCALONLY = register(
    Algorithm(
        "localonly",
        "Local-only (FedSup Table 2): each client trains its own model, never averaged",
        LocalOnlyConfig,
        LocalOnlyPolicy,
        FedAvgClient,
        vectorizable=True,
        sync_only="its clients never aggregate: no model version for an update to be stale against",
    )
)

"""LG-FedAvg: "Think Locally, Act Globally: Federated Learning with Local and Global
Representations", Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, NeurIPS 2019
FL workshop (arXiv:2001.01523), Alg. 1; a baseline of FedSup's Table 2.

The model splits into each client's local representation theta^l_k (the body: every tensor but
the global layers, batch-norm statistics included) and the global layers theta^g (the top: the
state-dict entries of the last `global_layers` weight layers, Linear or Conv; by default the last
linear layer). Each round a client trains theta^l_k and theta^g jointly (FedAvg's client
procedure); the server averages theta^g only, sample-weighted,
theta^g <- sum_k n_k theta^g_k / sum_k n_k, and theta^l_k stays the client's. Only theta^g is
sent down and up, so the default cost (`capabilities.train_cost`: the bytes of the task's and the result's
weights) counts exactly those; theta^l_k is held by the server between rounds only so that any
executor can train any client, starts from the initial body theta^l_0 when k is first selected,
and travels in the task's `body` and the result's `keep` (never counted as sent).

Evaluation (our choice; the paper evaluates local models on their own devices): `test_accuracy`
/ `test_loss` are the mean over the clients that have trained of (theta^l_k + theta^g) on their
own test data, and `personal_accuracy` is the same (no fine-tuning). `initial_accuracy` is the
paper's "new devices" view: a client that never trained, the initial body theta^l_0 with the
current theta^g, on each client's own test data, over all clients.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from pydantic import Field
from torch import nn

from ..config import AlgorithmConfig, ConfigError, RunConfig
from ..evaluate import Evaluator
from ..models import build_model
from ..types import ClientId, Round, Weights
from . import aggregate
from .base import ServerPolicy
from .fedavg import FedAvgClient
from .local import ClientContext, LocalState, Trained, host
from .localonly import mean_of, own_model_scores
from .messages import ClientFailure, ClientResult, ClientTask, FederationContext, OnDevice, ServerState
from .personal import accuracy_stats, own_test_rows
from .registry import Algorithm, register


class LGFedAvgConfig(AlgorithmConfig):
    name: str = "lgfedavg"
    global_layers: int = Field(
        1, ge=1, description="how many of the last weight layers (Linear/Conv) form the global layers theta^g"
    )


@dataclass(frozen=True, kw_only=True)
class LGTask(ClientTask):
    """`weights` are the global layers theta^g; `body` the client's local representation theta^l_k."""

    body: Weights


def global_keys(model: nn.Module, layers: int) -> frozenset[str]:
    """State-dict names of the last `layers` weight layers (Linear or Conv) in module order."""
    weighted = [name for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))]
    if layers > len(weighted):
        raise ConfigError(f"algorithm.global_layers: {layers} > the model's {len(weighted)} weight layers")
    return frozenset(k for k in model.state_dict() if k.rsplit(".", 1)[0] in weighted[-layers:])


class LGFedAvgPolicy(ServerPolicy):
    """FedAvg over theta^g; each client's theta^l_k kept in `ServerState.clients`. The state's
    weights hold theta^l_0 (what a new client starts from) and the current theta^g."""

    def __init__(self, config: RunConfig, context: FederationContext):
        super().__init__(config, context)
        model = build_model(config.model, context.input_shape, context.num_classes)
        self.global_keys = global_keys(model, config.algorithm.global_layers)

    def split(self, weights: Weights) -> tuple[Weights, Weights]:
        """(theta^g, theta^l) of a whole model's weights."""
        top = {k: v for k, v in weights.items() if k in self.global_keys}
        return top, {k: v for k, v in weights.items() if k not in self.global_keys}

    def body(self, state: ServerState, client: ClientId) -> Weights:
        """theta^l_k, or theta^l_0 for a client never selected before."""
        return state.clients.get(client, self.split(state.weights)[1])

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        top = self.split(state.weights)[0]
        return [self.task(c, round, top, kind=LGTask, body=self.body(state, c)) for c in clients]

    def summand(self, result: ClientResult) -> dict[str, np.ndarray]:
        """n_k theta^g_k and n_k (the result's weights are theta^g_k alone)."""
        return aggregate.weighted_sum(result.weights, result.num_examples)

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """Alg. 1 (server): theta^g <- sum_k n_k theta^g_k / sum_k n_k; theta^l_k kept per client."""
        if not results:
            return state.replace(round=round)
        top = aggregate.mean_of(total, self.split(state.weights)[0])
        clients = {**state.clients, **{r.client_id: dict(r.keep["body"]) for r in results}}
        return state.replace(round=round, weights=aggregate.merge(state.weights, top), clients=clients)

    def personal_models(self, state: ServerState) -> dict[ClientId, Weights]:
        """theta^l_k + theta^g of each client that has trained."""
        top = self.split(state.weights)[0]
        return {c: {**body, **top} for c, body in state.clients.items()}

    def evaluate(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """Mean over trained clients of (theta^l_k + theta^g) on their own test data."""
        own = own_model_scores(self.personal_models(state), self.global_model(), evaluator, self.context)
        return {"test_accuracy": mean_of([s["accuracy"] for s in own]), "test_loss": mean_of([s["loss"] for s in own])}

    def personalize(self, state: ServerState, round: Round, evaluator: Evaluator) -> dict[str, float]:
        """`personal_accuracy`: (theta^l_k + theta^g) of each trained client on its own test data;
        `initial_accuracy`: a new device's (theta^l_0 + theta^g) on every client's test data."""
        own = own_model_scores(self.personal_models(state), self.global_model(), evaluator, self.context)
        correct = evaluator.logits(state.weights, self.global_model()).argmax(1) == evaluator.y
        new = [float(correct[rows].double().mean()) for _, rows in own_test_rows(self.context, evaluator.y.numpy())]
        return accuracy_stats(new, [s["accuracy"] for s in own])


class LGFedAvgClient(FedAvgClient):
    """FedAvg's local training of theta^l_k and theta^g together; theta^g goes up as the result's
    weights, theta^l_k as its `keep`. Vectorizable as FedAvg's."""

    def load(self, task: LGTask, ctx: ClientContext) -> nn.Module:
        """The whole model theta^l_k + theta^g."""
        return ctx.load(task.model, task.body, task.weights)

    def final(self, task: LGTask, state: LocalState, ctx: ClientContext) -> Trained:
        top, body = split(task, ctx.tensors(state.model))
        return Trained(top, keep={"body": body})

    def run_vectorized(self, tasks, datas, ctx):
        return [
            split_result(t, out) for t, out in zip(tasks, super().run_vectorized([whole(t) for t in tasks], datas, ctx))
        ]


def whole(task: LGTask) -> LGTask:
    """The task with the whole model theta^l_k + theta^g as its weights (what the client trains)."""
    return dataclasses.replace(task, weights={**task.body, **task.weights})


def split(task: LGTask, weights: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(theta^g_k, theta^l_k) of a trained whole model: the task's keys, and the rest."""
    return {k: v for k, v in weights.items() if k in task.weights}, {
        k: v for k, v in weights.items() if k not in task.weights
    }


def split_result(task: LGTask, out: ClientResult | ClientFailure) -> ClientResult | ClientFailure:
    """A trained whole model's result as theta^g_k (weights, sent up) and theta^l_k (`keep`, on the host)."""
    if isinstance(out, ClientFailure):
        return out
    top, body = split(task, out.weights)
    if isinstance(out.weights, OnDevice):
        top = OnDevice(top, out.weights.nonfinite & top.keys())
    return dataclasses.replace(out, weights=top, keep={"body": host(body)})


LGFEDAVG = register(
    Algorithm(
        "lgfedavg",
        "LG-FedAvg (Liang et al. 2020): local bodies, FedAvg over the global top layers",
        LGFedAvgConfig,
        LGFedAvgPolicy,
        LGFedAvgClient,
        vectorizable=True,
    )
)

"""PyramidFL-style client selection on whole-model FedAvg, MergeSFL's baseline.

"PyramidFL: A Fine-grained Client Selection Framework for Efficient Federated Learning", Chenning
Li, Xiao Zeng, Mi Zhang, Zhichao Cao, MobiCom 2022 (public code `liecn/PyramidFL`,
`prune_client_tasks`; docs/papers.md, PyramidFL: public code, prune_client_tasks). Each round:
over-sample ceil(oversample * K) candidates, most of them the clients with the largest last
reward (the norm of their last model update, the code's gradient-norm reward) and a share
explored uniformly; predict each candidate's completion time from its device (training FLOPs /
FLOP/s + model bytes down and up / bandwidth + latency) and keep the K fastest. Training and
aggregation are FedAvg's. The code's optional per-client update dropout and adaptive local
epochs are not implemented.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np
from pydantic import Field

from .. import rng
from ..devices.cost import client_time, nbytes
from ..types import ClientId, Round, Weights
from .fedavg import FedAvgClient, FedAvgConfig, FedAvgPolicy
from .local import ClientContext, LocalState, Trained
from .messages import ClientResult, ClientTask, ServerState
from .registry import Algorithm, register


class PyramidFLConfig(FedAvgConfig):
    name: str = "pyramidfl"
    oversample: float = Field(1.3, ge=1, description="candidates per round: ceil(oversample * clients_per_round)")
    explore: float = Field(0.2, ge=0, le=1, description="share of the candidates drawn uniformly (unexplored first)")


class PyramidFLPolicy(FedAvgPolicy):
    def init_state(self, weights: Weights) -> ServerState:
        state = super().init_state(weights)
        return state.replace(clients={c: {"reward": np.array(np.nan)} for c in range(self.context.num_clients)})

    def predicted_time(self, client: ClientId, round: Round, model_bytes: int) -> float:
        """Completion time of a client's round on its device: FedAvg's compute plus the model both ways."""
        flops = (
            self.context.cost_of(self.config.model).train_flops
            * self.context.num_examples[client]
            * self.config.federation.local_epochs
        )
        return client_time(self.context.device_state(client, round), flops, model_bytes, model_bytes).total_s

    def select(self, state: ServerState, round: Round, available: Sequence[ClientId], count: int) -> list[ClientId]:
        available = self.candidates(round, available)
        k = min(count, len(available))
        m = min(len(available), math.ceil(self.config.algorithm.oversample * k))
        reward = {c: float(state.clients[c]["reward"]) for c in available}
        seen = sorted((c for c in available if not math.isnan(reward[c])), key=lambda c: (-reward[c], c))
        explored = min(m, math.ceil(self.config.algorithm.explore * m - 1e-9))
        chosen = seen[: m - explored]
        rest = [c for c in available if c not in chosen]
        unseen = [c for c in rest if math.isnan(reward[c])]
        pool = unseen if len(unseen) >= m - len(chosen) else rest
        g = rng.generator(self.context.seed, "pyramidfl-explore", round)
        chosen += [int(c) for c in g.choice(np.asarray(pool), size=m - len(chosen), replace=False)]
        size = nbytes(state.weights)
        fastest = sorted(chosen, key=lambda c: (self.predicted_time(c, round, size), c))[:k]
        return sorted(fastest)

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """FedAvg, then each participant's reward: the norm of its update x_k - x_t (which the
        client reports, `update_norm`)."""
        new = super().aggregate(state, round, results, total)
        clients = dict(state.clients)
        for r in results:
            clients[r.client_id] = {"reward": np.array(r.metrics["update_norm"])}
        return new.replace(clients=clients)


class PyramidFLClient(FedAvgClient):
    """FedAvg's local training; the result also reports ||x_k - x_t|| over the parameters
    (`update_norm`, a `clients.parquet` column), the reward PyramidFL's selection reads, computed
    in float64 on the client's device."""

    def final(self, task: ClientTask, state: LocalState, ctx: ClientContext) -> Trained:
        trained = super().final(task, state, ctx)
        start = ctx.on_device(task.weights)
        squares = [
            ((trained.weights[k].double() - start[k].double()) ** 2).sum() for k, _ in state.model.named_parameters()
        ]
        return dataclasses.replace(trained, metrics={**trained.metrics, "update_norm": sum(squares).sqrt()})


PYRAMIDFL = register(
    Algorithm(
        "pyramidfl",
        "PyramidFL-style selection (MergeSFL baseline): oversample by reward, keep the fastest",
        PyramidFLConfig,
        PyramidFLPolicy,
        PyramidFLClient,
        sync_only="it over-selects and keeps the fastest clients itself (a deadline of its own)",
    )
)

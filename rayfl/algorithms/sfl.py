"""Typical split federated learning, the SFL baseline of MergeSFL (Liao et al., ICDE 2024, Sec. V).

SplitFed: "SplitFed: When Federated Learning Meets Split Learning", Thapa, Chamikara, Camtepe,
Sun, AAAI 2022 (arXiv:2004.12088). Each selected worker runs `tau` iterations of its bottom
model with one uniform batch size; per iteration the server takes one top-model step per worker
on that worker's features, in worker order (SplitFed-V2 style, one shared top model), and sends
each worker the gradient of its features. After the round the bottom models are averaged
weighted by the samples they processed (uniform batch sizes make that a plain mean, as in
MergeSFL's public code) and the top model is the server's. `merge_features: true` merges all
workers' features into one top step per iteration instead (MergeSFL's feature merging alone).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from pydantic import Field

from ..config import AlgorithmConfig
from ..types import ClientId, Round
from . import aggregate
from .messages import ClientResult, ClientTask, ServerState
from .registry import Algorithm, register
from .split import SplitClient, SplitPolicy, SplitTask

SPLIT_MODELS = {
    "digits": "cnn2",
    "mnist": "cnn2",
    "fashion_mnist": "cnn2",
    "mnist1d": "cnn1d",
    "cifar10": "alexnet",
    "cifar100": "alexnet",
}
SPLIT_SYNC = "split learning trains its workers together with the server's top model at every iteration"
"""The split-capable model a split algorithm takes on each dataset when the config names none."""


class SFLConfig(AlgorithmConfig):
    name: str = "sfl"
    tau: int = Field(10, ge=1, description="iterations per round tau (MergeSFL's code: 42)")
    merge_features: bool = Field(False, description="one top step on all workers' merged features per iteration")


class SFLPolicy(SplitPolicy):
    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        bottom = self.bottom(state.weights)
        return [
            self.task(c, round, bottom, kind=SplitTask, local_epochs=1, tau=self.config.algorithm.tau) for c in clients
        ]

    def aggregate(
        self, state: ServerState, round: Round, results: Sequence[ClientResult], total: Mapping[str, np.ndarray]
    ) -> ServerState:
        """Bottom models averaged by samples processed (Eq. 17 with d_i); the top model is the
        server's, already folded into `state` by the round's `TopServer.finish`."""
        if not results:
            return state.replace(round=round)
        bottoms = aggregate.weighted_mean([r.weights for r in results], [r.num_samples for r in results])
        return state.replace(round=round, weights=aggregate.merge(state.weights, bottoms))


SFL = register(
    Algorithm(
        "sfl",
        "Typical split FL (SplitFed style): bottom models on workers, top on the server",
        SFLConfig,
        SFLPolicy,
        SplitClient,
        SPLIT_MODELS,
        sync_only=SPLIT_SYNC,
        over_every_client="which workers hold data, each round",
    )
)

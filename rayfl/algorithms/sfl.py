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

from typing import Sequence

from pydantic import Field

from . import aggregate
from .base import ClientProcedure, ClientResult, ClientTask, ServerState
from .registry import Algorithm, register
from ..config import AlgorithmConfig
from ..models import build_model, to_torch
from ..models.layers import split
from .split import SplitPolicy, SplitTask, TopServer
from ..types import ClientId, Round


class SFLConfig(AlgorithmConfig):
    name: str = "sfl"
    tau: int = Field(10, ge=1, description="iterations per round tau (MergeSFL's code: 42)")
    merge_features: bool = Field(False, description="one top step on all workers' merged features per iteration")


class SFLPolicy(SplitPolicy):
    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        fed, cfg = self.config.federation, self.config.algorithm
        bottom = {k: state.weights[k] for k in self.bottom_keys}
        return [SplitTask(c, round, bottom, self.config.model, 1, fed.batch_size, fed.lr, tau=cfg.tau) for c in clients]

    def open_server(self, state: ServerState, round: Round, tasks: Sequence[SplitTask]) -> TopServer:
        model = build_model(self.config.model, self.context.input_shape, self.context.num_classes)
        model.load_state_dict(to_torch(state.weights))
        top = split(model, self.config.model.split_layer)[1]
        return TopServer(top, self.top_lrs(tasks), self.config.algorithm.merge_features, self.context.seed, round)

    def top_lrs(self, tasks: Sequence[SplitTask]) -> list[float]:
        """The top model's learning rate(s) for the round: `federation.lr` for every step."""
        return [self.config.federation.lr]

    def aggregate(self, state: ServerState, round: Round, results: Sequence[ClientResult], server: TopServer) -> ServerState:
        """Bottom models averaged by samples processed (Eq. 17 with d_i), top model from the server."""
        update = dict(server.weights())
        if results:
            update.update(aggregate.weighted_mean([r.weights for r in results], [r.num_samples for r in results]))
        return state.replace(round=round, weights=aggregate.merge(state.weights, update))


SFL = register(Algorithm("sfl", "Typical split FL (SplitFed style): bottom models on workers, top on the server", SFLConfig, SFLPolicy, ClientProcedure))

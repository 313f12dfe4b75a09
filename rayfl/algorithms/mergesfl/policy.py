"""MergeSFL's server policy: the control module (Alg. 1) driving split learning with feature merging.

Per round h: the estimates mu_i, beta_i (Eq. 5-6, measured from the device model with noise and
smoothed with alpha) give every worker a batch size (Eq. 9, the fastest gets D); the genetic
algorithm picks the worker set with the least KL(Phi_h || Phi_0) under the ingress budget
sum d_i <= B / c (Eq. 10-12), seeded by participation priority (Eq. 13); the selected batch
sizes are fine-tuned toward KL <= epsilon (Eq. 14) and scaled to fill the budget (Alg. 1 l.7).
Training merges all workers' features into one top-model step per iteration and dispatches
each worker the gradient of its own mean loss; worker i's learning rate is lr * d_i / b
(proportional to its batch size; b = `federation.batch_size`, so `federation.lr` is the rate
for a batch of b samples, as for typical SFL and FedAvg, and every method takes the same step
per sample: the paper gives the rule, not its constant), the top model's the same rule over
the merged batch (`scale_top_lr`), and bottom models are averaged weighted by d_i (Eq. 17).

Ablations (Fig. 11): `merge_features: false` takes one top step per worker instead (no
merging); `regulate_batch: false` gives every worker one identical batch size, the mean of the
Eq. 9 sizes ("the average of batch sizes in MergeSFL"), with no fine-tuning; `kl_aware: false`
selects `clients_per_round` workers uniformly and skips Eq. 14. AdaSFL is the last two of these
with regulation on (`adasfl`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import numpy as np
from pydantic import Field

from ... import rng
from ...config import RunConfig
from ...statetypes import state_type
from ...types import ClientId, Round
from ..messages import ClientTask, FederationContext, ServerState
from ..registry import Algorithm, register
from ..sfl import SPLIT_MODELS, SPLIT_SYNC, SFLConfig, SFLPolicy
from ..split import SplitClient, SplitTask
from . import control


class MergeSFLConfig(SFLConfig):
    name: str = "mergesfl"
    merge_features: bool = Field(True, description="merge all workers' features into one top step (ablation: false)")
    regulate_batch: bool = Field(
        True,
        description="Eq. 9 batch size regulation and Eq. 14 fine-tuning (ablation false: one batch size, the mean of "
        "Eq. 9's)",
    )
    kl_aware: bool = Field(
        True, description="GA selection and Eq. 14 fine-tuning toward Phi_0 (false: uniform selection)"
    )
    scale_top_lr: bool = Field(
        True, description="top-model lr proportional to the batch it steps on, as worker lrs (false: lr)"
    )
    max_batch: int = Field(32, ge=1, description="D: the fastest worker's batch size")
    max_merged: int = Field(
        160, ge=1, description="B / c: the most samples of features the server takes per iteration (Eq. 10)"
    )
    budget: Literal["fixed", "estimated"] = Field(
        "fixed",
        description="B^h of Eq. 10: max_merged every round, or estimated from the ingress the PS observed in earlier "
        "rounds (Sec. IV-B)",
    )
    budget_quantile: float = Field(
        0.5, gt=0, lt=1, description="estimated B^h: this quantile of the earlier rounds' observed ingress"
    )
    ingress_jitter: float = Field(
        0.0, ge=0, description="sigma of the PS's available ingress: B^h = max_merged exp(sigma N(0, 1)) per round"
    )
    epsilon: float = Field(0.01, ge=0, description="KL target of the Eq. 14 fine-tuning")
    alpha: float = Field(0.8, ge=0, le=1, description="moving-average weight of Eq. 5-6")
    noise: float = Field(0.1, ge=0, description="relative std of the measured mu_hat, beta_hat around the device model")
    ga_population: int = Field(100, ge=2)
    ga_generations: int = Field(150, ge=1)
    ga_islands: int = Field(4, ge=1)


@state_type
@dataclass(frozen=True)
class Ingress:
    """The PS's ingress observed in each round so far (B^h / c), what `budget: estimated` reads."""

    observed: tuple[float, ...]


class MergeSFLPolicy(SFLPolicy):
    def __init__(self, config: RunConfig, context: FederationContext):
        super().__init__(config, context)
        hist = context.label_histogram().astype(float)
        self.V = hist / np.maximum(hist.sum(1, keepdims=True), 1)  # V_i: each worker's label distribution
        self.phi_0 = self.V.mean(0)  # Phi_0 = (1/N) sum_i V_i
        cfg = config.algorithm
        self.ga = control.GAConfig(population=cfg.ga_population, generations=cfg.ga_generations, islands=cfg.ga_islands)

    def measure(self, round: Round) -> tuple[np.ndarray, np.ndarray]:
        """mu_hat, beta_hat of every worker: per-sample bottom compute time and feature + gradient
        transmission time from the device model, times (1 + noise * N(0, 1)), keyed by round."""
        noise = self.config.algorithm.noise
        mu, beta = np.empty(self.context.num_clients), np.empty(self.context.num_clients)
        for c in range(self.context.num_clients):
            dev = self.context.device_state(c, round)
            jitter = 1 + noise * rng.generator(self.context.seed, "mergesfl-measure", round, c).standard_normal(2)
            mu[c] = self.bottom_flops / dev.flops * max(jitter[0], 0.1)
            beta[c] = 8 * self.feature_bytes * (1 / dev.down_bps + 1 / dev.up_bps) * max(jitter[1], 0.1)
        return mu, beta

    def estimates(self, state: ServerState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mu, beta, K) carried in the state's per-client entries."""
        arr = lambda key: np.array([float(state.clients[c][key]) for c in range(self.context.num_clients)])
        return arr("mu"), arr("beta"), arr("K")

    def init_state(self, weights):
        mu, beta = self.measure(0)
        clients = {
            c: {"mu": np.array(mu[c]), "beta": np.array(beta[c]), "K": np.array(0.0)}
            for c in range(self.context.num_clients)
        }
        return ServerState(round=0, weights=dict(weights), opt_state=Ingress(()), clients=clients)

    def ingress(self, round: Round) -> float:
        """The PS's available ingress B^h / c in round h (samples of features per iteration):
        max_merged, times exp(sigma N(0, 1)) keyed by (seed, round) with `ingress_jitter` sigma."""
        cfg = self.config.algorithm
        noise = (
            rng.generator(self.context.seed, "mergesfl-ingress", round).standard_normal() if cfg.ingress_jitter else 0.0
        )
        return cfg.max_merged * float(np.exp(cfg.ingress_jitter * noise))

    def budget(self, state: ServerState) -> float:
        """B^h / c for the coming round (Eq. 10): `max_merged`, or with `budget: estimated` the
        `budget_quantile` of the ingress observed in earlier rounds ("we analyze the statistical
        distribution of the ingress bandwidth ... in the previous rounds", Sec. IV-B), which is
        `max_merged` before any round was observed."""
        cfg, seen = self.config.algorithm, state.opt_state.observed
        if cfg.budget == "fixed" or not seen:
            return float(cfg.max_merged)
        return float(np.quantile(seen, cfg.budget_quantile))

    def batch_sizes(self, state: ServerState) -> np.ndarray:
        """Alg. 1 l.1-2: Eq. 9 for every worker; without regulation (Fig. 11's "MergeSFL w/o
        BR") every worker gets the mean of those sizes, rounded."""
        mu, beta, _ = self.estimates(state)
        d = control.regulate_batch_sizes(mu, beta, self.config.algorithm.max_batch)
        if not self.config.algorithm.regulate_batch:
            return np.full(len(d), max(1, round(float(d.mean()))))
        return d

    def select(self, state: ServerState, round: Round, available: Sequence[ClientId], count: int) -> list[ClientId]:
        """Alg. 1 l.3-5: the GA over the available workers, seeded by priority (Eq. 13; it chooses
        how many); without `kl_aware`, `count` workers uniformly."""
        cfg = self.config.algorithm
        if not cfg.kl_aware:
            return super().select(state, round, available, count)
        avail = np.asarray(sorted(self.candidates(round, available)))
        d = self.batch_sizes(state)[avail]
        _, _, K = self.estimates(state)
        g = rng.generator(self.context.seed, "mergesfl-ga", round)
        chosen = control.genetic_select(
            self.V[avail], d, self.phi_0, control.priority(K[avail]), 1.0, self.budget(state), g, self.ga
        )
        return [int(c) for c in avail[chosen]]

    def configure(self, state: ServerState, round: Round, clients: Sequence[ClientId]) -> list[ClientTask]:
        """Alg. 1 l.6-7: fine-tune the chosen workers' batch sizes (Eq. 14), fill the budget;
        learning rates proportional to batch size."""
        cfg, fed = self.config.algorithm, self.config.federation
        idx = np.asarray(clients, int)
        d = self.batch_sizes(state)[idx]
        if cfg.regulate_batch and cfg.kl_aware and len(idx) > 1:
            mu, beta, _ = self.estimates(state)
            d = control.finetune_batch_sizes(self.V[idx], d, (mu + beta)[idx], self.phi_0, cfg.epsilon, cfg.max_batch)
        d = control.fill_bandwidth(d, 1.0, self.budget(state), cfg.max_batch)
        bottom, opt = self.bottom(state.weights), self.optimizer(round)
        return [
            self.task(
                int(c),
                round,
                bottom,
                kind=SplitTask,
                local_epochs=1,
                batch_size=int(di),
                optimizer=opt.with_lr(opt.lr * int(di) / fed.batch_size),
                tau=cfg.tau,
            )
            for c, di in zip(idx, d)
        ]

    def top_lrs(self, round: Round, tasks: Sequence[SplitTask]) -> list[float]:
        """With `scale_top_lr` (default), "learning rate proportional to batch size" applied to the
        top model's steps as to the workers' (lr_i = lr d_i / b): lr * sum_i d_i / b for a merged
        step, lr * d_i / b for worker i's own step (b = `federation.batch_size`). The paper states
        the rule for workers only; `scale_top_lr: false` keeps every top step at `federation.lr`
        (the public code's plain SGD at lr_h)."""
        cfg, fed, lr = self.config.algorithm, self.config.federation, self.lr(round)
        if not cfg.scale_top_lr or not tasks:
            return super().top_lrs(round, tasks)
        if cfg.merge_features:
            return [lr * sum(t.batch_size for t in tasks) / fed.batch_size]
        return [lr * t.batch_size / fed.batch_size for t in tasks]

    def aggregate(self, state, round, results, total: Mapping[str, np.ndarray]):
        """Eq. 17 (bottoms weighted by d_i, via samples processed; the top model is the server's);
        then participation counts K_i and the Eq. 5-6 estimates for the next round."""
        new = super().aggregate(state, round, results, total)
        mu_prev, beta_prev, K = self.estimates(state)
        mu_hat, beta_hat = self.measure(round)
        alpha = self.config.algorithm.alpha
        mu, beta = control.moving_average(mu_prev, mu_hat, alpha), control.moving_average(beta_prev, beta_hat, alpha)
        for r in results:
            K[r.client_id] += 1
        clients = {
            c: {"mu": np.array(mu[c]), "beta": np.array(beta[c]), "K": np.array(K[c])}
            for c in range(self.context.num_clients)
        }
        return new.replace(opt_state=Ingress((*state.opt_state.observed, self.ingress(round))), clients=clients)

    def round_metrics(self, state: ServerState, round: Round, tasks: Sequence[ClientTask]) -> dict[str, float]:
        """The merged label distribution's KL to Phi_0 (Eq. 12), the merged batch sum d_i and the
        PS's available ingress B^h / c."""
        if not tasks:
            return {"kl": float("nan"), "merged_batch": 0, "ingress": self.ingress(round)}
        idx = np.array([t.client_id for t in tasks])
        d = np.array([t.batch_size for t in tasks])
        return {
            "kl": control.kl(control.merged_distribution(self.V[idx], d, np.ones(len(idx), bool)), self.phi_0),
            "merged_batch": int(d.sum()),
            "ingress": self.ingress(round),
        }


class AdaSFLConfig(MergeSFLConfig):
    """AdaSFL, MergeSFL's baseline: batch size regulation for heterogeneous workers, without
    feature merging or KL-aware worker selection (uniform selection of clients_per_round)."""

    name: str = "adasfl"
    merge_features: bool = False
    kl_aware: bool = False


OVER_EVERY_WORKER = "Eq. 9 over all workers, label distributions, genetic selection over every worker"

register(
    Algorithm(
        "adasfl",
        "AdaSFL (MergeSFL's baseline): split FL with batch regulation only",
        AdaSFLConfig,
        MergeSFLPolicy,
        SplitClient,
        SPLIT_MODELS,
        sync_only=SPLIT_SYNC,
        over_every_client=OVER_EVERY_WORKER,
        max_clients=1_000,
    )
)

MERGESFL = register(
    Algorithm(
        "mergesfl",
        "MergeSFL (Liao et al. 2024): split FL with feature merging, batch regulation, GA selection",
        MergeSFLConfig,
        MergeSFLPolicy,
        SplitClient,
        SPLIT_MODELS,
        sync_only=SPLIT_SYNC,
        over_every_client=OVER_EVERY_WORKER,
        max_clients=1_000,
    )
)

"""The `federation` section: rounds, clients a round, local training, the learning-rate schedule,
and the mode of the virtual clock (`sync`, `deadline`, `async`; docs/time.md)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .base import MAX_PER_ROUND, MAX_ROUNDS, Strict


class Schedule(Strict):
    """What every schedule kind has: a linear warm-up (FedSup Sec. 4.1: 20 rounds, then cosine
    from 0.1). Rounds 1..W take lr * r / W; the schedule then runs over the other R - W rounds as
    it would over a whole run of that length (round W + 1 takes lr)."""

    warmup_rounds: int = Field(
        0,
        ge=0,
        description="W: rounds over which the rate rises linearly to lr (round r: lr r / W) before the schedule starts",
    )


class ConstantSchedule(Schedule):
    """The same learning rate every round."""

    kind: Literal["constant"] = "constant"


class ExponentialSchedule(Schedule):
    """lr_r = max(lr * gamma^(r-1), min_lr) (MergeSFL: gamma 0.993, min_lr 0.005)."""

    kind: Literal["exponential"] = "exponential"
    gamma: float = Field(0.993, gt=0, le=1, description="decay per round")
    min_lr: float = Field(0.0, ge=0, description="floor of the decayed rate")


class MultiStepSchedule(Schedule):
    """lr times gamma at each milestone (HeteroFL: MultiStepLR, gamma 0.1, stepped per round)."""

    kind: Literal["multistep"] = "multistep"
    milestones: list[float] = Field(
        min_length=1, description="fractions of the rounds in (0, 1), or round numbers >= 1"
    )
    gamma: float = Field(0.1, gt=0, le=1)

    @field_validator("milestones")
    @classmethod
    def _milestones(cls, v: list[float]) -> list[float]:
        fractions = all(0 < m < 1 for m in v)
        rounds = all(m >= 1 and float(m).is_integer() for m in v)
        if not (fractions or rounds):
            raise ValueError("give fractions of the rounds (all in (0, 1)) or round numbers (all integers >= 1)")
        if sorted(v) != list(v):
            raise ValueError("milestones must be in increasing order")
        return v


class CosineSchedule(Schedule):
    """Cosine annealing over the rounds: min_lr + (lr - min_lr)(1 + cos(pi (r-1) / R)) / 2 (FeDepth's code)."""

    kind: Literal["cosine"] = "cosine"
    min_lr: float = Field(0.0, ge=0)


LrSchedule = Annotated[
    Union[ConstantSchedule, ExponentialSchedule, MultiStepSchedule, CosineSchedule],
    Field(discriminator="kind"),
]


class GradClip(Strict):
    """Gradient clipping before each local step: the norm over the optimizer's parameters
    (`torch.nn.utils.clip_grad_norm_`) or every entry (`clip_grad_value_`)."""

    kind: Literal["norm", "value"] = "norm"
    max: float = Field(gt=0, allow_inf_nan=False, description="the largest norm, or the largest |entry|")

    @model_validator(mode="before")
    @classmethod
    def _a_number_is_a_norm(cls, v: Any) -> Any:
        return {"kind": "norm", "max": v} if isinstance(v, (int, float)) and not isinstance(v, bool) else v


class StalenessConfig(Strict):
    """s(t - tau): the weight of an update t - tau model versions old (Xie, Koyejo, Gupta 2019,
    "Asynchronous Federated Optimization", Sec. 5.2): constant 1; polynomial (t - tau + 1)^-a
    (a = 0.5 is FedBuff's 1 / sqrt(1 + staleness)); hinge 1 up to b, then 1 / (a (t - tau - b) + 1)."""

    kind: Literal["constant", "polynomial", "hinge"] = "polynomial"
    a: float = Field(0.5, gt=0, allow_inf_nan=False, description="the decay a (polynomial, hinge)")
    b: float = Field(4.0, ge=0, allow_inf_nan=False, description="the versions a hinge keeps at weight 1")


class DeadlineConfig(Strict):
    """`federation.mode: deadline` (Bonawitz et al. 2019, "Towards Federated Learning at Scale",
    Sec. 2.2): select ceil(K (1 + over_selection)) clients, close the round at the K-th update or
    at the deadline, whichever comes first; with `min_reports` M, a round that closes with fewer
    than M updates on time is abandoned."""

    target_clients: int | None = Field(
        None,
        ge=1,
        le=MAX_PER_ROUND,
        description="K: the updates that close a round (None: federation.clients_per_round)",
    )
    over_selection: float = Field(0.3, ge=0, allow_inf_nan=False, description="select this fraction more than K")
    deadline_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="virtual seconds after its start a round closes at the latest (None: no deadline)",
    )
    late: Literal["drop", "carry"] = Field(
        "drop", description="a late update: dropped, or carried into the round it arrives in, weighted by its staleness"
    )
    min_reports: int = Field(
        0,
        ge=0,
        le=MAX_PER_ROUND,
        description="abandon a round whose updates on time are fewer: no server step, its updates discarded "
        "(Bonawitz et al. 2019, Sec. 2.2); 0: never",
    )

    def selected(self, target: int) -> int:
        """The clients a round selects to close at K = `target` updates: ceil(K (1 + over_selection))."""
        return math.ceil(target * (1 + self.over_selection) - 1e-9)


class AsyncConfig(Strict):
    """`federation.mode: async`: `concurrency` clients always in flight, each replaced the moment
    it reports; the server steps by FedAsync's rule (Xie et al. 2019) or FedBuff's (Nguyen et
    al., AISTATS 2022)."""

    rule: Literal["fedasync", "fedbuff"] = Field(
        "fedbuff", description="fedasync: mix every update in; fedbuff: a server step per buffer_size updates"
    )
    concurrency: int | None = Field(
        None, ge=1, le=MAX_PER_ROUND, description="clients in flight (None: federation.clients_per_round)"
    )
    buffer_size: int = Field(5, ge=1, description="FedBuff's K: updates per server step (at most concurrency)")
    mixing: float = Field(
        0.6,
        gt=0,
        le=1,
        description="FedAsync's alpha: x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new, alpha_t = alpha s(t - tau)",
    )


class FederationConfig(Strict):
    mode: Literal["sync", "deadline", "async"] = Field(
        "sync",
        description="sync: every round waits for its slowest client; deadline: over-select, close at K updates or "
        "the deadline; async: FedAsync / FedBuff",
    )
    deadline: DeadlineConfig = DeadlineConfig()
    asynchronous: AsyncConfig = Field(AsyncConfig(), alias="async")
    staleness: StalenessConfig = Field(
        StalenessConfig(), description="how a stale update is weighted (async, and deadline with late: carry)"
    )
    rounds: int = Field(30, ge=1, le=MAX_ROUNDS, description="rounds; under mode async, server steps (model versions)")
    clients_per_round: int = Field(10, ge=1, le=MAX_PER_ROUND)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(10, ge=1)
    optimizer: Literal["sgd", "adam"] = Field(
        "sgd", description="the clients' local optimizer (and a split top model's)"
    )
    lr: float = Field(0.05, gt=0)
    lr_schedule: LrSchedule = Field(ConstantSchedule(), description="lr over rounds; the server sets each round's rate")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum (sgd only)")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: GradClip | None = Field(
        None,
        description="clip each step's gradients: {kind: norm|value, max: M}; a number M is {kind: norm, max: M} "
        "(HeteroFL: norm 1; FedSup's code: value 1)",
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="the clients' local steps: fp32, or bf16 (torch's autocast on the client's device; the weights, "
        "the optimizer and the sums stay float32 / float64)",
    )
    eval_every: int = Field(1, ge=1, description="evaluate the global model every k rounds (and the last)")
    eval_clients: int = Field(
        1000,
        ge=1,
        le=MAX_PER_ROUND,
        description="where test data is per client (synthetic): evaluate on a seeded sample of this many clients",
    )
    eval_batch_size: int = Field(500, ge=1)
    personalize_epochs: int = Field(
        0,
        ge=0,
        description="at each evaluation, fine-tune the head this many epochs per client and report initial_accuracy "
        "/ personal_accuracy (FedSup Sec. 4.1); 0: off",
    )
    personalize_lr: float | None = Field(None, gt=0, description="the head fine-tuning rate (None: lr)")
    checkpoint_every: int = Field(10, ge=0, description="save the server state every k rounds (and the last); 0 never")
    max_failed_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="on Ray: a round that lost more than this fraction of its clients to dying client actors (not "
        "their own failures) runs them again instead of recording them",
    )
    target_accuracy: float | None = Field(
        None, gt=0, le=1, description="summary.json reports the virtual time to reach it"
    )

    @model_validator(mode="after")
    def _buffer_fits(self) -> "FederationConfig":
        if (
            self.mode == "async"
            and self.asynchronous.rule == "fedbuff"
            and self.asynchronous.buffer_size > self.concurrency
        ):
            raise ValueError(
                f"federation.async.buffer_size ({self.asynchronous.buffer_size}) exceeds the clients in flight, "
                f"federation.async.concurrency ({self.concurrency}): the buffer would never fill"
            )
        return self

    @model_validator(mode="after")
    def _warmup_fits(self) -> "FederationConfig":
        if self.lr_schedule.warmup_rounds >= self.rounds:
            raise ValueError(
                f"federation.lr_schedule.warmup_rounds ({self.lr_schedule.warmup_rounds}) leaves no round of the "
                f"schedule: give fewer than federation.rounds ({self.rounds})"
            )
        return self

    @property
    def target_clients(self) -> int:
        """Deadline mode's K (default `clients_per_round`)."""
        return self.deadline.target_clients or self.clients_per_round

    @property
    def concurrency(self) -> int:
        """Async mode's clients in flight (default `clients_per_round`)."""
        return self.asynchronous.concurrency or self.clients_per_round

    @field_validator("momentum")
    @classmethod
    def _momentum_is_sgd_only(cls, v: float, info: ValidationInfo) -> float:
        if v and info.data.get("optimizer", "sgd") != "sgd":
            raise ValueError(f"applies to optimizer sgd only ({info.data['optimizer']} keeps its own moments)")
        return v

"""The local optimizer as one description on the task, and learning-rate schedules over rounds.

A `ClientTask` carries an `OptimizerSpec` (kind, lr, momentum, weight decay, gradient clipping);
every training path builds its optimizer from it, so every option is honoured everywhere (a
split worker's bottom model and the coordinator's top model included). The server sets each
round's rate from `federation.lr_schedule` (torch's own schedulers, stepped once per round).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Iterable, Literal

import torch

from .config import ConstantSchedule, CosineSchedule, ExponentialSchedule, FederationConfig, GradClip, MultiStepSchedule


@dataclass(frozen=True)
class OptimizerSpec:
    """What a client (or a split top model) optimizes with in one round."""

    kind: Literal["sgd", "adam"]
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    grad_clip: GradClip | None = None
    """Clip the gradients (their norm over the optimizer's parameters, or each entry) before each step."""

    @classmethod
    def of(cls, fed: FederationConfig, lr: float) -> "OptimizerSpec":
        return cls(fed.optimizer, lr, fed.momentum, fed.weight_decay, fed.grad_clip)

    @property
    def state_slots(self) -> int:
        """Copies of the parameters the optimizer keeps (Adam's two moments, SGD's momentum)."""
        return 2 if self.kind == "adam" else int(self.momentum > 0)

    def with_lr(self, lr: float) -> "OptimizerSpec":
        """The same optimizer at another rate (MergeSFL: lr proportional to batch size)."""
        return dataclasses.replace(self, lr=lr)

    def build(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """A fresh torch optimizer; with `grad_clip`, every `step()` first clips the gradients of
        the optimizer's own parameters (a step pre-hook)."""
        params = list(params)
        if self.kind == "sgd":
            opt = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)
        else:
            opt = torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)
        if self.grad_clip is not None:
            clip_grads, limit = CLIP[self.grad_clip.kind], self.grad_clip.max

            def clip(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
                clip_grads([p for g in optimizer.param_groups for p in g["params"]], limit)

            opt.register_step_pre_hook(clip)
        return opt


CLIP = {"norm": torch.nn.utils.clip_grad_norm_, "value": torch.nn.utils.clip_grad_value_}
"""`GradClip.kind` -> torch's clipping of a list of parameters' gradients in place."""


def lr_schedule(fed: FederationConfig) -> list[float]:
    """The learning rate of rounds 1..R (index r - 1): `federation.lr` under `lr_schedule`, from
    torch's schedulers stepped once per round (round 1 takes `lr`, or lr / W after a warm-up of W
    rounds: `LinearLR` then the schedule over R - W rounds, joined by `SequentialLR`)."""
    spec, warmup = fed.lr_schedule, fed.lr_schedule.warmup_rounds
    rounds = fed.rounds - warmup
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=fed.lr)
    if isinstance(spec, ConstantSchedule):
        sched = torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0)
    elif isinstance(spec, ExponentialSchedule):
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, spec.gamma)
    elif isinstance(spec, MultiStepSchedule):
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestone_rounds(spec, rounds), spec.gamma)
    elif isinstance(spec, CosineSchedule):
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=rounds, eta_min=spec.min_lr)
    else:  # pragma: no cover - the config union is closed
        raise ValueError(f"unknown lr schedule {spec!r}")
    if warmup:
        rise = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1)
        sched = torch.optim.lr_scheduler.SequentialLR(opt, [rise, sched], milestones=[warmup])
    floor = getattr(spec, "min_lr", 0.0)
    out = []
    for _ in range(fed.rounds):
        out.append(max(opt.param_groups[0]["lr"], floor))
        opt.step()
        sched.step()
    return out


def milestone_rounds(spec: MultiStepSchedule, rounds: int) -> list[int]:
    """Milestones as scheduler steps: a fraction f of R rounds is step ceil(f R) (the rate drops
    from round ceil(f R) + 1 on); round numbers are taken as they are."""
    if all(m < 1 for m in spec.milestones):
        return [math.ceil(m * rounds) for m in spec.milestones]
    return [int(m) for m in spec.milestones]

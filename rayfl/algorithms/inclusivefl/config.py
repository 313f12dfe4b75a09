"""InclusiveFL's settings (Liu et al. 2022): the depth groups and their server optimizers, shared
by InclusiveFL and the baselines of its Table 2 on the same groups."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from ...config import AlgorithmConfig

DEPTH_MODELS = {"digits": "transformer", "mnist1d": "transformer", "synthetic": "transformer"}


class DepthGroupsConfig(AlgorithmConfig):
    """Depth groups and their server optimizers (InclusiveFL and its depth baselines)."""

    depths: str = Field(
        "2-4-6", description="layers of each device class's model, weakest first (the paper: 4-8-12 of 12)"
    )
    server_opt: Literal["adam", "avg"] = Field(
        "adam", description="each group's server step: FedAdam, or FedAvg (eta 1)"
    )
    server_lr: float = Field(0.01, gt=0, description="FedAdam's rate eta for every group")
    server_lrs: list[float] | None = Field(
        None, description="FedAdam's rate per group, weakest first (the paper: 2e-4, 5e-5, 5e-5)"
    )
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.99, ge=0, lt=1)
    tau: float = Field(1e-3, gt=0)
    group_weighting: Literal["samples", "users"] = Field(
        "samples", description="within and across groups: by samples (FedAvg), or per user as Alg. 1 prints"
    )

    @field_validator("depths")
    @classmethod
    def _depths(cls, v: str) -> str:
        if (
            not re.fullmatch(r"\d+(-\d+)*", v)
            or any(int(d) < 1 for d in v.split("-"))
            or sorted(set(map(int, v.split("-")))) != list(map(int, v.split("-")))
        ):
            raise ValueError("write depths like 2-4-6: positive, increasing, one per device class")
        return v


class InclusiveFLConfig(DepthGroupsConfig):
    name: str = "inclusivefl"
    beta: float = Field(0.2, ge=0, le=1, description="momentum distillation factor beta (0: InclusiveFL w/o MD)")


class DepthBaselineConfig(DepthGroupsConfig):
    """A baseline of InclusiveFL's Table 2 on the same groups: one model trained by FedAvg with
    the groups' server optimizer (`plan`)."""

    baseline: Literal["alllarge", "allsmall", "exclusivefl"]


def parse_depths(depths: str) -> list[int]:
    return [int(d) for d in depths.split("-")]


# InclusiveFL's baselines (Table 2) on the same depth groups and server optimizers (`plan`).
class AllLargeDepthConfig(DepthBaselineConfig):
    """AllLarge: every client trains the largest model, ignoring memory budgets."""

    name: str = "alllarge_depth"
    baseline: Literal["alllarge"] = "alllarge"


class AllSmallDepthConfig(DepthBaselineConfig):
    """AllSmall: every client trains the smallest model, so every device fits."""

    name: str = "allsmall_depth"
    baseline: Literal["allsmall"] = "allsmall"


class ExclusiveFLDepthConfig(DepthBaselineConfig):
    """ExclusiveFL: only the clients whose device fits the largest model train."""

    name: str = "exclusivefl_depth"
    baseline: Literal["exclusivefl"] = "exclusivefl"

"""FedSup's and E-FedSup's keys (`algorithm.*`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...config import AlgorithmConfig


class FedSupConfig(AlgorithmConfig):
    name: str = "fedsup"
    subnets: int = Field(
        3, ge=1, description="M: sub-nets trained per local iteration (the paper: 3; the published runs: 1)"
    )
    sandwich: bool = Field(True, description="the largest and the smallest sub-net always among the M (M >= 3)")
    inplace_distill: bool = Field(
        True, description="the other sub-nets learn from the largest's soft predictions (Eq. 6-7); else from the labels"
    )
    temperature: float = Field(
        1.0,
        gt=0,
        allow_inf_nan=False,
        description="T of the distillation's softmaxes (Sec. 3.3.2 names one, gives no value; the public code: 1)",
    )
    distill_weight: float = Field(
        1.0,
        ge=0,
        le=1,
        description="lambda: a distilled sub-net's loss is lambda T^2 soft-CE + (1 - lambda) CE on the labels "
        "(Hinton et al.; the public code: 1, soft targets only)",
    )


class EFedSupConfig(AlgorithmConfig):
    name: str = "efedsup"
    tier_budgets: list[float] | None = Field(
        None,
        description="each device class's budget (weakest first) as a share of the largest sub-net's FLOPs (params); "
        "None: evenly from the smallest's share to 1 (one class: 1)",
    )
    budget: Literal["flops", "params"] = Field(
        "flops", description="what a tier's budget bounds: FLOPs (the paper) or parameters (the public code)"
    )
    aggregation: Literal["fill", "count"] = Field(
        "fill", description="untrained entries: the broadcast values (the paper) or left out of each entry's mean"
    )
    max_draws: int = Field(100, ge=1, description="sub-nets drawn before a client falls back to the smallest")

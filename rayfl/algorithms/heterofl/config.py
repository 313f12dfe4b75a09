"""HeteroFL's keys (`algorithm.*`) and its baselines' (AllLarge, AllSmall, ExclusiveFL)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from ...config import AlgorithmConfig
from .levels import _MIX


class HeteroFLConfig(AlgorithmConfig):
    name: str = "heterofl"
    levels: str = Field("a1-b1-c1-d1-e1", description="level mix: letters a..e (rates 1..1/16) with proportions")
    mode: Literal["fix", "dynamic", "capability", "class", "budget"] = Field(
        "dynamic",
        description="how clients get levels (budget: the widest width that fits each client's memory, levels from "
        "the budgets)",
    )
    mask: Literal["zero", "-inf", "none"] = Field("zero", description="masked cross-entropy fill (zero: public code)")
    label_split_rows: bool = Field(
        True,
        description="aggregate classifier rows over only the clients whose label split has the class (the public "
        "code always does)",
    )
    sbn_clients: float = Field(1.0, gt=0, le=1, description="share of clients whose training data calibrate static BN")
    weighting: Literal["count", "samples"] = Field(
        "count", description="count: HeteroFL's plain per-entry mean; samples: FedAvg's n_k weights"
    )
    match_depths: str | None = Field(
        None,
        pattern=r"^\d+(-\d+)*$",
        description="level rates that match the parameter counts of these depths of a depth-sliceable model, e.g. "
        "2-4-6",
    )

    @field_validator("levels")
    @classmethod
    def _mix(cls, v: str) -> str:
        if (
            not _MIX.match(v)
            or any(int(t[1:]) == 0 for t in v.split("-"))
            or len({t[0] for t in v.split("-")}) != len(v.split("-"))
        ):
            raise ValueError("write levels like a1-b1-e1: distinct letters a..e, each with a positive proportion")
        return v


# Baselines of the paper (Tables 1-3), under the same machinery (Scaler, masking, static BN,
# per-level metrics): FedAvg's weights, one level, dealt as the baseline asks.
class AllLargeConfig(HeteroFLConfig):
    """AllLarge: every client trains the largest model, ignoring memory budgets."""

    name: str = "alllarge"
    levels: Literal["a1"] = "a1"
    mode: Literal["fix"] = "fix"
    weighting: Literal["count", "samples"] = "samples"


class AllSmallConfig(HeteroFLConfig):
    """AllSmall: every client trains the smallest model, so every device fits."""

    name: str = "allsmall"
    levels: str = Field("e1", pattern=r"^[a-e]1$", description="the one level, e.g. e1")
    mode: Literal["fix"] = "fix"
    weighting: Literal["count", "samples"] = "samples"


class ExclusiveFLConfig(HeteroFLConfig):
    """ExclusiveFL: only the clients whose device fits the largest model train."""

    name: str = "exclusivefl"
    levels: Literal["a1"] = "a1"
    mode: Literal["capability"] = "capability"
    weighting: Literal["count", "samples"] = "samples"

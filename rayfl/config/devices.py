"""The `devices` section: who the clients' devices are (a profile of classes, or a trace), when
they are online (`availability`), how the population changes (`population`). docs/devices.md
describes the models; `rayfl.devices` implements them."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, field_validator, model_validator

from .base import Strict


class BernoulliAvailability(Strict):
    """Each round a client is online with its device class's `availability` (one draw per round
    for the whole population, keyed by (seed, round)); online, it stays so for the whole round,
    so it never drops mid-task. With a trace, every device is always online."""

    kind: Literal["bernoulli"] = "bernoulli"


class DiurnalAvailability(Strict):
    """A day cycle: device d is online at time t with probability
    p_d(t) = on_fraction (1 + amplitude cos(2 pi (t / period_s - phase_d))), phase_d uniform per
    device, in sessions of mean length `session_s` (a two-state chain on a grid of `slot_s`)."""

    kind: Literal["diurnal"]
    on_fraction: float = Field(
        0.3, gt=0, lt=1, description="the share of time a device is online, averaged over the day"
    )
    session_s: float = Field(
        1800.0, gt=0, allow_inf_nan=False, description="mean length of an online session, virtual seconds"
    )
    amplitude: float = Field(
        0.8, ge=0, allow_inf_nan=False, description="depth of the day cycle: 0 flat, 1 never online at the trough"
    )
    period_s: float = Field(86400.0, gt=0, allow_inf_nan=False, description="length of the cycle (a day)")
    slot_s: float = Field(
        60.0, gt=0, allow_inf_nan=False, description="the chain's time step; sessions start and end on it"
    )

    @model_validator(mode="after")
    def _fits(self) -> "DiurnalAvailability":
        if self.on_fraction * (1 + self.amplitude) > 1:
            raise ValueError(
                f"on_fraction ({self.on_fraction:g}) x (1 + amplitude ({self.amplitude:g})) exceeds 1: the peak "
                "would be online more than always"
            )
        if self.slot_s >= self.session_s:
            raise ValueError(f"slot_s ({self.slot_s:g}) must be shorter than session_s ({self.session_s:g})")
        return self


class TraceAvailability(Strict):
    """Online in the intervals of the device's trace (`devices.trace`, its intervals table)."""

    kind: Literal["trace"]


Availability = Annotated[
    Union[BernoulliAvailability, DiurnalAvailability, TraceAvailability], Field(discriminator="kind")
]


class PopulationConfig(Strict):
    """A population that changes: clients 0 .. initial - 1 are there at time 0; arrivals (a
    Poisson process) take the next client ids, each with its own data, until data.num_clients
    is reached; each departure (a Poisson process) removes a client present, drawn uniformly,
    for good."""

    initial: int | None = Field(None, ge=1, description="clients present at time 0 (None: data.num_clients)")
    arrivals_per_hour: float = Field(0.0, ge=0, allow_inf_nan=False, description="mean arrivals per virtual hour")
    departures_per_hour: float = Field(0.0, ge=0, allow_inf_nan=False, description="mean departures per virtual hour")

    @property
    def changes(self) -> bool:
        return self.arrivals_per_hour > 0 or self.departures_per_hour > 0


class DevicesConfig(Strict):
    profile: str = Field("jetson", description="a built-in profile name or a path to a profile YAML")
    mix: str | None = Field(
        None,
        description="class proportions replacing the profile's, in its class order, e.g. '1:2:7' (weak:medium:strong)",
    )
    trace: str | None = Field(
        None,
        description="a device trace folder (devices.parquet, intervals.parquet; docs/devices.md): replaces the "
        "profile, and its intervals are when each device is online unless devices.availability says otherwise",
    )
    availability: Availability = Field(
        BernoulliAvailability(), description="when a device is online: bernoulli | diurnal | trace"
    )
    population: PopulationConfig = PopulationConfig()

    @field_validator("mix")
    @classmethod
    def _mix(cls, v: str | None) -> str | None:
        if v is not None:
            mix_shares(v)
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "DevicesConfig":
        if self.mix is not None and self.trace is not None:
            raise ValueError("mix: a trace has no device classes to mix; leave devices.mix unset with devices.trace")
        if self.availability.kind == "trace" and self.trace is None:
            raise ValueError("availability: kind trace needs devices.trace (a trace folder with its intervals)")
        return self


def mix_shares(mix: str) -> list[float]:
    """'1:2:7' -> [1.0, 2.0, 7.0]; ValueError unless non-negative numbers, not all zero."""
    try:
        shares = [float(x) for x in mix.split(":")]
    except ValueError:
        shares = []
    if not shares or any(x < 0 for x in shares) or sum(shares) <= 0:
        raise ValueError(f"write a mix like '1:2:7': non-negative numbers joined by ':', not all zero (got {mix!r})")
    return shares

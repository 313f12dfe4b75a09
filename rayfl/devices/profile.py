"""Device profiles (populations of device classes) and what a device offers in a round (`DeviceState`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, ValidationError, model_validator

from ..catalog import profile_files
from ..config import ConfigError, DevicesConfig, Strict, mix_shares
from ..config.base import closest
from ..config.files import format_error, read_yaml

ENERGY_J_PER_GFLOP = 0.1
"""Default training energy: 0.1 J per GFLOP (10 GFLOP/J, an assumption for a phone's or a
Jetson's sustained training; docs/devices.md)."""
ENERGY_J_PER_MB = 1.0
"""Default radio energy: 1 J per MB (an assumption between WiFi and cellular; docs/devices.md)."""


class DeviceClass(Strict):
    """One kind of device and its share of the population."""

    name: str
    proportion: float = Field(gt=0, description="share of clients of this class (normalised over classes)")
    flops: list[float] = Field(min_length=1, description="effective training FLOP/s of each mode")
    memory_mb: float | None = Field(None, gt=0, description="memory budget for training, MiB")
    memory_width: float | None = Field(
        None,
        gt=0,
        description="memory budget as a width (FeDepth's 'x r width'): the measured memory of training the run's "
        "model at "
        "width rate r (its configured batch size and optimizer); r > 1 is a wider network than the model",
    )
    bandwidth_mbps: tuple[float, float] = Field(description="[low, high]: the range of link speeds, Mb/s")
    bandwidth_jitter: float | None = Field(
        None,
        ge=0,
        description="None: a link speed drawn uniformly in [low, high] every round; sigma: each client keeps "
        "a level drawn once in [low, high] and each round scales it by exp(sigma N(0, 1)), clipped to [low, high]",
    )
    latency_ms: float = Field(0.0, ge=0, description="one-way latency added per exchange, ms")
    availability: float = Field(
        1.0, gt=0, le=1, description="chance of being online in a round (availability: bernoulli)"
    )
    energy_j_per_gflop: float = Field(
        ENERGY_J_PER_GFLOP, ge=0, allow_inf_nan=False, description="joules per 10^9 training FLOPs"
    )
    energy_j_per_mb: float = Field(
        ENERGY_J_PER_MB, ge=0, allow_inf_nan=False, description="joules per 10^6 bytes sent or received"
    )
    battery_j: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="joules a device can spend on tasks between charges (None: no limit)",
    )

    @model_validator(mode="after")
    def _check(self) -> "DeviceClass":
        if any(f <= 0 for f in self.flops):
            raise ValueError("flops: every mode must be > 0")
        if (self.memory_mb is None) == (self.memory_width is None):
            raise ValueError("give the memory budget as exactly one of memory_mb or memory_width")
        low, high = self.bandwidth_mbps
        if not 0 < low <= high:
            raise ValueError("bandwidth_mbps: need 0 < low <= high")
        return self


class DeviceProfile(Strict):
    """A population: device classes with proportions; modes re-drawn every `mode_period` rounds."""

    name: str
    mode_period: int = Field(0, ge=0, description="rounds between power-mode re-draws; 0 keeps one mode per client")
    classes: list[DeviceClass] = Field(min_length=1)


def builtin_profiles() -> dict[str, Path]:
    return profile_files()


def load_profile(spec: str) -> DeviceProfile:
    """A built-in profile by name, or a user profile from a YAML path; errors name the file and key."""
    builtin = builtin_profiles()
    path = builtin.get(spec, Path(spec).expanduser())
    if spec not in builtin and not path.is_file():
        raise ConfigError(
            f"devices.profile: {spec!r} is neither a built-in profile ({', '.join(sorted(builtin))}) nor a "
            f"file{closest(spec, builtin)}"
        )
    raw = read_yaml(path)
    try:
        return DeviceProfile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {format_error(exc, raw, DeviceProfile)}") from None


def with_mix(profile: DeviceProfile, mix: str | None) -> DeviceProfile:
    """The profile with its class proportions replaced by `mix` ('1:2:7', one number per class in
    the profile's order; a class at 0 is left out), so a budget mix is searchable like any number."""
    if mix is None:
        return profile
    shares = mix_shares(mix)
    if len(shares) != len(profile.classes):
        names = ":".join(c.name for c in profile.classes)
        raise ConfigError(
            f"devices.mix: {mix!r} has {len(shares)} numbers; profile {profile.name!r} has {len(profile.classes)} "
            f"classes ({names})"
        )
    classes = [c.model_copy(update={"proportion": s}) for c, s in zip(profile.classes, shares) if s > 0]
    return profile.model_copy(update={"classes": classes})


def configured_profile(devices: DevicesConfig) -> DeviceProfile:
    """The profile a `devices` config section asks for, with its mix applied."""
    return with_mix(load_profile(devices.profile), devices.mix)


@dataclass(frozen=True)
class DeviceState:
    """What a client's device offers in one round."""

    device: str
    flops: float
    down_bps: float
    up_bps: float
    latency_s: float
    energy_j_per_gflop: float = ENERGY_J_PER_GFLOP
    energy_j_per_mb: float = ENERGY_J_PER_MB
    battery_j: float = float("inf")
    """Joules between charges (inf: no limit)."""

"""Device profiles (populations of device classes) and the seeded per-round device state."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from pydantic import Field, ValidationError, model_validator

from .. import rng
from ..config import ConfigError, DevicesConfig, Strict, mix_shares
from ..configfile import format_error, read_yaml


class DeviceClass(Strict):
    """One kind of device and its share of the population."""

    name: str
    proportion: float = Field(gt=0, description="share of clients of this class (normalised over classes)")
    flops: list[float] = Field(min_length=1, description="effective training FLOP/s of each mode")
    memory_mb: float | None = Field(None, gt=0, description="memory budget for training, MiB")
    memory_width: float | None = Field(
        None,
        gt=0,
        description="memory budget as a width (FeDepth's 'x r width'): the measured memory of training the run's model at "
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
    availability: float = Field(1.0, gt=0, le=1, description="chance of being online in a round")

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
    folder = resources.files("rayfl.devices") / "profiles"
    return {p.name.removesuffix(".yaml"): Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


def load_profile(spec: str) -> DeviceProfile:
    """A built-in profile by name, or a user profile from a YAML path; errors name the file and key."""
    builtin = builtin_profiles()
    path = builtin.get(spec, Path(spec).expanduser())
    if spec not in builtin and not path.is_file():
        raise ConfigError(f"devices.profile: {spec!r} is neither a built-in profile ({', '.join(sorted(builtin))}) nor a file")
    raw = read_yaml(path)
    try:
        return DeviceProfile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {format_error(exc, raw)}") from None


def with_mix(profile: DeviceProfile, mix: str | None) -> DeviceProfile:
    """The profile with its class proportions replaced by `mix` ('1:2:7', one number per class in
    the profile's order; a class at 0 is left out), so a budget mix is searchable like any number."""
    if mix is None:
        return profile
    shares = mix_shares(mix)
    if len(shares) != len(profile.classes):
        names = ":".join(c.name for c in profile.classes)
        raise ConfigError(f"devices.mix: {mix!r} has {len(shares)} numbers; profile {profile.name!r} has {len(profile.classes)} classes ({names})")
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
    bandwidth_bps: float
    latency_s: float
    available: bool


class Population:
    """The device of every logical client, and its seeded state in each round.

    Classes are dealt in exact proportions (largest remainder), then shuffled over clients
    by (seed, "devices"). A client's mode is keyed by (seed, round // mode_period, client,
    "mode"); its bandwidth by (seed, round, client, "bandwidth"), and, with `bandwidth_jitter`,
    its bandwidth level by (seed, client, "bandwidth-level"). Who is online in a round is one
    vectorized draw for the whole population keyed by (seed, round, "availability"), so a
    round costs a few arrays of N entries, never a loop over the clients.
    """

    def __init__(self, profile: DeviceProfile, num_clients: int, seed: int):
        self.profile = profile
        self.seed = seed
        share = np.array([c.proportion for c in profile.classes])
        share = share / share.sum() * num_clients
        counts = np.floor(share).astype(int)
        counts[np.argsort(-(share - counts), kind="stable")[: num_clients - counts.sum()]] += 1
        classes = np.repeat(np.arange(len(profile.classes), dtype=np.int32), counts)
        self.class_of = rng.generator(seed, "devices").permutation(classes)
        self.always_online = all(c.availability >= 1 for c in profile.classes)
        self._online: tuple[int, np.ndarray] | None = None

    def device_class(self, client: int) -> DeviceClass:
        return self.profile.classes[self.class_of[client]]

    def class_memory_bytes(self, width_memory: Callable[[float], float]) -> np.ndarray:
        """Each class's memory budget in bytes; `width_memory(r)` measures a `memory_width` budget."""
        return np.array([c.memory_mb * 2**20 if c.memory_mb is not None else width_memory(c.memory_width) for c in self.profile.classes])

    def memory_bytes(self, width_memory: Callable[[float], float]) -> np.ndarray:
        """(num_clients,) each client's memory budget in bytes (`class_memory_bytes` per client)."""
        return self.class_memory_bytes(width_memory)[self.class_of]

    def online(self, round: int) -> np.ndarray:
        """(num_clients,) who is online in the round (computed once per round)."""
        if self._online is None or self._online[0] != round:
            chance = np.array([c.availability for c in self.profile.classes], np.float32)[self.class_of]
            self._online = (round, rng.generator(self.seed, "availability", round).random(len(self.class_of), np.float32) < chance)
        return self._online[1]

    def state(self, client: int, round: int) -> DeviceState:
        cls = self.device_class(client)
        epoch = round // self.profile.mode_period if self.profile.mode_period else 0
        mode = rng.generator(self.seed, "mode", epoch, client).integers(len(cls.flops))
        mbps = self._bandwidth_mbps(cls, client, round)
        online = self.always_online or bool(self.online(round)[client])
        return DeviceState(
            device=cls.name,
            flops=float(cls.flops[mode]),
            bandwidth_bps=float(mbps) * 1e6,
            latency_s=cls.latency_ms / 1e3,
            available=bool(online),
        )

    def _bandwidth_mbps(self, cls: DeviceClass, client: int, round: int) -> float:
        low, high = cls.bandwidth_mbps
        draw = rng.generator(self.seed, "bandwidth", round, client)
        if cls.bandwidth_jitter is None:
            return float(draw.uniform(low, high))
        level = rng.generator(self.seed, "bandwidth-level", client=client).uniform(low, high)
        return float(np.clip(level * np.exp(cls.bandwidth_jitter * draw.standard_normal()), low, high))

    def available(self, round: int) -> Sequence[int]:
        """The clients online in the round, in id order (a range when every device always is)."""
        if self.always_online:
            return range(len(self.class_of))
        return np.flatnonzero(self.online(round))

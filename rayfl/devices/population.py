"""The device of every logical client, and who is there and online when (docs/devices.md)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from .. import rng
from ..config import Availability, BernoulliAvailability, DevicesConfig, PopulationConfig
from .availability import Bernoulli, Diurnal, TraceWindows
from .churn import Churn
from .profile import DeviceClass, DeviceProfile, DeviceState, configured_profile
from .trace import DeviceTrace, load_trace


class Population:
    """The device of every logical client, its seeded state in each round, and who is present
    and online at a time.

    From a profile: classes are dealt in exact proportions (largest remainder), then shuffled
    over clients by (seed, "devices"). A client's mode is keyed by (seed, round // mode_period,
    client, "mode"); its bandwidth by (seed, round, client, "bandwidth"), and, with
    `bandwidth_jitter`, its bandwidth level by (seed, client, "bandwidth-level"). From a trace:
    each client is given a trace device by (seed, client) and has its numbers. Who is online
    (`rayfl.devices.availability`) and present (`rayfl.devices.churn`) costs a few arrays of N
    entries per decision, never a loop over the clients. Above `rng.EAGER_CLIENTS`, a profile's
    always-online population holds nothing N-long: classes, memory budgets and online chances are
    `rng.Column`s computed for the clients asked about.
    """

    def __init__(
        self,
        source: DeviceProfile | DeviceTrace,
        num_clients: int,
        seed: int,
        availability: Availability = BernoulliAvailability(),
        churn: PopulationConfig = PopulationConfig(),
    ):
        self.seed, self.num_clients = seed, num_clients
        self.profile = source if isinstance(source, DeviceProfile) else None
        self.trace = source if isinstance(source, DeviceTrace) else None
        if self.profile is not None:
            share = np.array([c.proportion for c in self.profile.classes])
            share = share / share.sum() * num_clients
            counts = np.floor(share).astype(int)
            counts[np.argsort(-(share - counts), kind="stable")[: num_clients - counts.sum()]] += 1
            if num_clients <= rng.EAGER_CLIENTS:
                classes = np.repeat(np.arange(len(self.profile.classes), dtype=np.int32), counts)
                self.class_of: np.ndarray | rng.Column | None = rng.generator(seed, "devices").permutation(classes)
            else:  # rank r of the keyed permutation holds class i where bounds[i-1] <= r < bounds[i]
                bounds, rank = np.cumsum(counts), rng.KeyedPermutation(num_clients, seed, "devices")
                self.class_of = rng.Column(
                    num_clients, lambda ids: np.searchsorted(bounds, rank(ids), side="right").astype(np.int32)
                )
        else:
            self.class_of = None
            self.device_of = self.trace.assign(num_clients, seed)
        self.availability = self._availability(availability)
        self.churn = Churn(churn, num_clients, seed) if churn.changes else None
        self.static = self.churn is None and isinstance(self.availability, Bernoulli) and self.availability.always

    @classmethod
    def of(cls, devices: DevicesConfig, num_clients: int, seed: int) -> "Population":
        """The population a `devices` config section asks for (its profile with its mix, or its trace)."""
        need = devices.availability.kind == "trace"
        source = load_trace(devices.trace, need) if devices.trace is not None else configured_profile(devices)
        return cls(source, num_clients, seed, devices.availability, devices.population)

    def _availability(self, cfg: Availability) -> Bernoulli | Diurnal | TraceWindows:
        if cfg.kind == "diurnal":
            return Diurnal(cfg, self.num_clients, self.seed)
        if cfg.kind == "trace":
            iv = self.trace.intervals
            index = {d: k for k, d in enumerate(self.trace.devices["device_id"])}
            rows = iv["device_id"].map(index).to_numpy(np.int64)
            return TraceWindows(
                self.device_of,
                (rows, iv["online_from_s"].to_numpy(float), iv["online_to_s"].to_numpy(float)),
                self.trace.periods(),
            )
        if self.profile is None:
            return Bernoulli(
                rng.Column(self.num_clients, lambda ids: np.ones(len(ids), np.float32)), self.seed, always=True
            )
        by_class = np.array([c.availability for c in self.profile.classes], np.float32)
        return Bernoulli(self.per_client(by_class), self.seed, always=bool(np.all(by_class >= 1)))

    def per_client(self, by_class: np.ndarray) -> np.ndarray | rng.Column:
        """A per-class value for every client: an array, or a `rng.Column` above `rng.EAGER_CLIENTS`."""
        if isinstance(self.class_of, np.ndarray):
            return by_class[self.class_of]
        class_of = self.class_of
        return rng.Column(self.num_clients, lambda ids: by_class[class_of[ids]])

    # ------------------------------------------------------------------ capabilities

    def device_class(self, client: int) -> DeviceClass:
        return self.profile.classes[self.class_of[client]]

    def class_memory_bytes(self, width_memory: Callable[[float], float]) -> np.ndarray:
        """Each class's memory budget in bytes; `width_memory(r)` measures a `memory_width` budget."""
        return np.array(
            [
                c.memory_mb * 2**20 if c.memory_mb is not None else width_memory(c.memory_width)
                for c in self.profile.classes
            ]
        )

    def memory_bytes(self, width_memory: Callable[[float], float]) -> np.ndarray | rng.Column:
        """(num_clients,) each client's memory budget in bytes."""
        if self.profile is None:
            return self.trace.devices["memory_bytes"].to_numpy(np.float64)[self.device_of]
        return self.per_client(self.class_memory_bytes(width_memory))

    def state(self, client: int, round: int) -> DeviceState:
        if self.profile is None:
            row = self.trace.devices.iloc[int(self.device_of[client])]
            battery = row["battery_j"]
            return DeviceState(
                device=f"trace:{row['device_id']}",
                flops=float(row["flops_per_s"]),
                down_bps=float(row["down_bps"]),
                up_bps=float(row["up_bps"]),
                latency_s=0.0,
                energy_j_per_gflop=float(row["energy_j_per_gflop"]),
                energy_j_per_mb=float(row["energy_j_per_mb"]),
                battery_j=float(battery) if battery == battery else math.inf,
            )
        cls = self.device_class(client)
        epoch = round // self.profile.mode_period if self.profile.mode_period else 0
        mode = rng.generator(self.seed, "mode", epoch, client).integers(len(cls.flops))
        bps = self._bandwidth_mbps(cls, client, round) * 1e6
        return DeviceState(
            device=cls.name,
            flops=float(cls.flops[mode]),
            down_bps=bps,
            up_bps=bps,
            latency_s=cls.latency_ms / 1e3,
            energy_j_per_gflop=cls.energy_j_per_gflop,
            energy_j_per_mb=cls.energy_j_per_mb,
            battery_j=cls.battery_j if cls.battery_j is not None else math.inf,
        )

    def _bandwidth_mbps(self, cls: DeviceClass, client: int, round: int) -> float:
        low, high = cls.bandwidth_mbps
        draw = rng.generator(self.seed, "bandwidth", round, client)
        if cls.bandwidth_jitter is None:
            return float(draw.uniform(low, high))
        level = rng.generator(self.seed, "bandwidth-level", client=client).uniform(low, high)
        return float(np.clip(level * np.exp(cls.bandwidth_jitter * draw.standard_normal()), low, high))

    @property
    def batteries(self) -> bool:
        """Whether any device has a limited battery."""
        if self.profile is None:
            return bool(self.trace.devices["battery_j"].notna().any())
        return any(c.battery_j is not None for c in self.profile.classes)

    # ------------------------------------------------------------------ presence on the clock

    def online(self, round: int, t: float) -> np.ndarray:
        """(num_clients,) who is present and online at time t of the round."""
        on = self.availability.online(round, t)
        return on & self.churn.present(t) if self.churn is not None else on

    def available(self, round: int, t: float = 0.0) -> Sequence[int]:
        """The clients present and online at time t of the round, in id order (a range when
        every device always is)."""
        if self.static:
            return range(self.num_clients)
        return np.flatnonzero(self.online(round, t))

    def until(self, client: int, round: int, t: float, horizon: float) -> float:
        """When a client online at t goes offline or leaves, if before `horizon` (inf otherwise)."""
        end = self.availability.until(client, round, t)
        if self.churn is not None:
            end = min(end, self.churn.leaves_at(client, horizon))
        return end if end < horizon else math.inf

    def since(self, client: int, round: int, t: float) -> float:
        """When the client's current online stretch began (a round under bernoulli)."""
        return self.availability.since(client, round, t)

    def size(self, t: float) -> int:
        """The clients present at time t."""
        return self.churn.size(t) if self.churn is not None else self.num_clients

"""When a device is online, on the virtual clock (`devices.availability`; docs/devices.md).

Each model answers, for a population of N devices, three questions at a decision time t (and
round r): who is online (`online`), until when a device online now stays online (`until`: a
task that would end later drops there), and when its current online stretch began
(`since`: a device that went offline between two of its tasks has recharged its battery). Every
answer is a pure function of (seed, device, time): the models compute forward from time 0 and
cache what they reached, so asking in any order gives the same answers.

- `Bernoulli`: each round a device is online with its class's probability, one draw per round
  keyed by (seed, round); online, it stays so through the round (it never drops mid-task).
- `Diurnal`: a two-state chain on a grid of `slot_s`. An online device ends its session in each
  step with probability q = slot_s / session_s (sessions are geometric, of mean session_s); an
  offline one comes online with the probability r_d(j) that keeps P(online at step j) equal to
  the day curve p_d(j) = f (1 + a cos(2 pi (j slot_s / period_s - phase_d))):
  p_d(j + 1) = p_d(j) (1 - q) + (1 - p_d(j)) r_d(j). Averaged over the uniform phases, the
  share of devices online is f at every time.
- `TraceWindows`: the intervals of a device trace, each device's repeating every `period_s`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import rng
from ..config import ConfigError, DiurnalAvailability


class Bernoulli:
    """Online per round with probability `chance` (per device: an array or an `rng.Column`);
    never drops mid-task. `always`: every chance is 1."""

    def __init__(self, chance: np.ndarray | rng.Column, seed: int, always: bool):
        self.chance, self.seed, self.always = chance, seed, always
        self._online: tuple[int, np.ndarray] | None = None
        self._since: tuple[int, np.ndarray] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_online": None, "_since": None}  # caches stay where they were computed

    def online(self, round: int, t: float) -> np.ndarray:
        if self._online is None or self._online[0] != round:
            self._online = (
                round,
                rng.generator(self.seed, "availability", round).random(len(self.chance), np.float32)
                < np.asarray(self.chance, np.float32),
            )
        return self._online[1]

    def until(self, client: int, round: int, t: float) -> float:
        return math.inf

    def since(self, client: int, round: int, t: float) -> float:
        """The first round of the device's current run of online rounds."""
        if self.always:
            return 0.0
        reached, first = (
            self._since
            if self._since is not None and self._since[0] <= round
            else (0, np.ones(len(self.chance), np.int64))
        )
        for r in range(reached + 1, round + 1):
            first = np.where(self.online(r, t), first, r + 1)
        self._since = (round, first)
        return float(first[client])


class Diurnal:
    """A day cycle with per-device phase, on-fraction and mean session length (module docstring)."""

    def __init__(self, cfg: DiurnalAvailability, num_devices: int, seed: int):
        self.cfg, self.n, self.seed = cfg, num_devices, seed
        self.q = cfg.slot_s / cfg.session_s
        check_rates(cfg, self.q)
        self._phase: np.ndarray | None = None
        self._step = -1
        self.log: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    def __getstate__(self) -> dict:
        """What is shipped to other processes: the model, never the chain computed so far
        (arrays read from Ray's object store are read-only)."""
        return {"cfg": self.cfg, "n": self.n, "seed": self.seed, "q": self.q, "_phase": None, "_step": -1, "log": None}

    @property
    def phase(self) -> np.ndarray:
        if self._phase is None:
            self._phase = rng.generator(self.seed, "diurnal-phase").random(self.n)
        return self._phase

    def chance(self, step: int) -> np.ndarray:
        """p_d at the step's start, for every device."""
        c = self.cfg
        return c.on_fraction * (1 + c.amplitude * np.cos(2 * np.pi * (step * c.slot_s / c.period_s - self.phase)))

    def _start(self, step: int, eligible: np.ndarray, chance: np.ndarray) -> None:
        """Devices in `eligible` come online at the step with probability `chance` (keyed by
        (seed, step)); each starts a session of a geometric number of slots."""
        g = rng.generator(self.seed, "diurnal", step)
        starting = eligible & (g.random(self.n) < chance)
        t = step * self.cfg.slot_s
        self.on |= starting
        self.began[starting] = t
        self.end[starting] = t + g.geometric(self.q, int(starting.sum())) * self.cfg.slot_s
        if self.log is not None:
            idx = np.flatnonzero(starting)
            self.log.append((idx, np.full(len(idx), t), self.end[idx]))

    def _advance(self, t: float) -> None:
        step = int(t // self.cfg.slot_s)
        if step < self._step:
            self._step = -1
        if self._step < 0:
            self.on = np.zeros(self.n, bool)
            self.began, self.end = np.zeros(self.n), np.zeros(self.n)
            self._start(0, np.ones(self.n, bool), self.chance(0))
            self._step = 0
        while self._step < step:
            j, s = self._step, self.cfg.slot_s
            p, p_next = self.chance(j), self.chance(j + 1)
            rate = (p_next - p * (1 - self.q)) / (1 - p)
            was_off = ~self.on
            self.on &= self.end > (j + 1) * s
            self._start(j + 1, was_off, rate)
            self._step = j + 1

    def online(self, round: int, t: float) -> np.ndarray:
        self._advance(t)
        return self.on

    def sessions(self, span_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every session that starts in [0, span_s): (device, start, end), ends cut at span_s."""
        self._step, self.log = -1, []
        self._advance(span_s - self.cfg.slot_s / 2)
        dev, began, end = (np.concatenate(x) for x in zip(*self.log))
        self._step, self.log = -1, None
        return dev, began, np.minimum(end, span_s)

    def until(self, client: int, round: int, t: float) -> float:
        self._advance(t)
        return float(self.end[client]) if self.on[client] else t

    def since(self, client: int, round: int, t: float) -> float:
        self._advance(t)
        return float(self.began[client])


def check_rates(cfg: DiurnalAvailability, q: float) -> None:
    """`ConfigError` unless the chain can follow the day curve: 0 <= r_d(j) <= 1 at every phase
    (checked on a grid 8 times finer than the slots over a whole period)."""
    t = np.arange(0.0, cfg.period_s, cfg.slot_s / 8)
    p = cfg.on_fraction * (1 + cfg.amplitude * np.cos(2 * np.pi * t / cfg.period_s))
    p_next = cfg.on_fraction * (1 + cfg.amplitude * np.cos(2 * np.pi * (t + cfg.slot_s) / cfg.period_s))
    rate = (p_next - p * (1 - q)) / (1 - p)
    if rate.min() < -1e-12 or rate.max() > 1 + 1e-12:
        raise ConfigError(
            f"devices.availability: sessions of {cfg.session_s:g} s cannot follow a day cycle of amplitude "
            f"{cfg.amplitude:g} "
            f"(the online share would fall faster than sessions end); lower amplitude or session_s"
        )


class TraceWindows:
    """A trace's intervals: device m online when (t mod period_m) lies in one of its intervals."""

    def __init__(
        self, device_of: np.ndarray, intervals: tuple[np.ndarray, np.ndarray, np.ndarray], period_s: np.ndarray
    ):
        self.device_of = device_of
        dev, frm, to = intervals
        order = np.lexsort((frm, dev))
        self.dev, self.frm, self.to = dev[order], frm[order], to[order]
        self.period = period_s
        self._online: tuple[float, np.ndarray] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_online": None}

    def _window(self, m: int, t: float) -> tuple[float, float] | None:
        """The interval of device m holding t, in absolute time (None: offline)."""
        base = math.floor(t / self.period[m]) * self.period[m]
        lo, hi = np.searchsorted(self.dev, [m, m + 1])
        tau = t - base
        hit = np.flatnonzero((self.frm[lo:hi] <= tau) & (tau < self.to[lo:hi]))
        if not len(hit):
            return None
        return base + float(self.frm[lo + hit[0]]), base + float(self.to[lo:hi][hit].max())

    def online(self, round: int, t: float) -> np.ndarray:
        if self._online is None or self._online[0] != t:
            tau = t - np.floor(t / self.period) * self.period
            inside = (self.frm <= tau[self.dev]) & (tau[self.dev] < self.to)
            on = np.zeros(len(self.period), bool)
            on[self.dev[inside]] = True
            self._online = (t, on[self.device_of])
        return self._online[1]

    def until(self, client: int, round: int, t: float) -> float:
        w = self._window(int(self.device_of[client]), t)
        return w[1] if w else t

    def since(self, client: int, round: int, t: float) -> float:
        w = self._window(int(self.device_of[client]), t)
        return w[0] if w else t

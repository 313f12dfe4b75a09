"""A population that changes over virtual time (`devices.population`; docs/devices.md).

Clients 0 .. initial - 1 are present at time 0. Arrivals are a Poisson process of rate
`arrivals_per_hour`: the k-th arrival, at the sum of k exponential gaps keyed by
(seed, "arrivals"), is client initial + k, with its own data (the partition's client of that
id), until data.num_clients is reached. Departures are a Poisson process of rate
`departures_per_hour`: the k-th, at the sum of k gaps, removes for good a client drawn
uniformly among those present then, keyed by (seed, k, "departure"). The events are computed
forward from time 0 and cached, so every answer is a pure function of (seed, time); what a
run holds is two arrays of N times.
"""

from __future__ import annotations

import math

import numpy as np

from .. import rng
from ..config import PopulationConfig


class Churn:
    def __init__(self, cfg: PopulationConfig, num_clients: int, seed: int):
        self.cfg, self.seed, self.n = cfg, seed, num_clients
        self.initial = cfg.initial or num_clients
        self.gap = 3600 / cfg.departures_per_hour if cfg.departures_per_hour > 0 else math.inf
        self.__setstate__(self.__dict__)

    def __getstate__(self) -> dict:
        """What is shipped to other processes: the model, never the events computed so far."""
        return {k: self.__dict__[k] for k in ("cfg", "seed", "n", "initial", "gap")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.arrived_at = np.zeros(self.n)
        self.arrived_at[self.initial :] = np.inf
        if self.cfg.arrivals_per_hour > 0:
            gaps = rng.generator(self.seed, "arrivals").exponential(
                3600 / self.cfg.arrivals_per_hour, self.n - self.initial
            )
            self.arrived_at[self.initial :] = np.cumsum(gaps)
        self.departed_at = np.full(self.n, np.inf)
        self.departures = 0
        self.next_departure = self._gap(0)

    def _gap(self, k: int) -> float:
        return (
            float(rng.generator(self.seed, "departure-gap", k).exponential(self.gap))
            if self.gap < math.inf
            else math.inf
        )

    def _through(self, t: float) -> None:
        """Process the departures up to time t."""
        while self.next_departure <= t:
            at, k = self.next_departure, self.departures
            arrived = int(np.searchsorted(self.arrived_at, at, side="right"))
            g = rng.generator(self.seed, "departure", k)
            for c in g.integers(arrived, size=64) if arrived else ():
                if self.departed_at[c] == np.inf:
                    self.departed_at[c] = at
                    break
            else:  # most have left: draw among those present
                present = np.flatnonzero(self.departed_at[:arrived] == np.inf)
                if len(present):
                    self.departed_at[g.choice(present)] = at
            self.departures = k + 1
            self.next_departure = at + self._gap(k + 1)

    def present(self, t: float) -> np.ndarray:
        """(N,) who is in the population at time t."""
        self._through(t)
        return (self.arrived_at <= t) & (self.departed_at > t)

    def leaves_at(self, client: int, t_end: float) -> float:
        """When the client leaves, if by `t_end` (inf otherwise)."""
        self._through(t_end)
        return float(self.departed_at[client])

    def size(self, t: float) -> int:
        self._through(t)
        return int(np.count_nonzero(self.arrived_at <= t) - np.count_nonzero(self.departed_at <= t))

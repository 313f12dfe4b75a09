"""The `ray` section: where a run's actors come from and what each takes (docs/ray.md,
docs/config.md), and the `Resources` its client actors take, read from it once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal, Mapping

from pydantic import Field, model_validator

from .base import MAX_ACTORS, ConfigError, Strict


class RayConfig(Strict):
    address: str | None = None
    num_actors: Literal["auto"] | Annotated[int, Field(ge=1, le=MAX_ACTORS)] = "auto"
    cpus_per_actor: float = Field(1.0, gt=0)
    gpus_per_actor: float = Field(0.0, ge=0)
    dashboard: bool = Field(True, description="start the dashboard (127.0.0.1) with a local cluster")
    actor_timeout_s: float = Field(
        600.0,
        gt=0,
        description="give up when client actors that fit the cluster are not placed, or none answers, within this",
    )
    coordinator_node: str = Field(
        "head",
        min_length=1,
        description="where the coordinator runs: head (the head node), any, or the name of a custom resource the "
        "chosen nodes have",
    )
    coordinator_restarts: int = Field(
        3, ge=0, description="times Ray restarts a coordinator that died (its run resumes from the newest checkpoint)"
    )
    rounds_ahead: Annotated[int, Field(ge=0)] | None = Field(
        None,
        description="rounds the coordinator may finish past the last one the driver has passed to its progress "
        "callback (a Tune report, a drill's action) before it waits; none: no bound (docs/ray.md)",
    )
    start_in_process: Literal["auto"] | bool = Field(
        "auto",
        description="run the first rounds in the driver's process while the cluster and the actors come up, and move "
        "the run onto the actors at the first round boundary after they answer (the same tables); on a local cluster "
        "of its own, a run whose rounds left take less than its actors' start finishes in the driver; auto: when the "
        "run starts a local cluster of its own and its actors take no GPU; true: on a running cluster too (actors "
        "that wait for free resources or new nodes); false: wait for the actors (docs/ray.md)",
    )
    pool_idle_s: float = Field(
        300.0,
        ge=0,
        description="on a running cluster, the run's actors stay warm in the pool for the next run this long; 0: "
        "they leave with the run (docs/ray.md)",
    )
    vectorize: Literal["auto"] | Annotated[int, Field(ge=1)] = Field(
        "auto",
        description="train this many of a call's clients together in one batched computation (torch.func.vmap); "
        "auto: on a GPU client actor every client of a call that its memory share holds (where the "
        "algorithm and model allow it), else 1",
    )
    sums: Literal["auto", "device", "host"] = Field(
        "auto",
        description="where an actor adds up the clients of a call whose aggregate is a sum: on the device they train "
        "on (only the call's sum leaves it), or on the host (each client's weights copied off the device first: "
        "spares the device the float64 sum); auto: device where the algorithm and federation.mode sum a call's "
        "clients, else nothing is summed there; device: refused where they do not",
    )
    clients_per_call: Literal["auto"] | Annotated[int, Field(ge=1)] = Field(
        "auto",
        description="clients an actor trains per call, returning one partial sum; in-process runs group them alike, "
        "so results do not depend on the runner; auto: 5, or with gpus_per_actor the round's clients per "
        "actor (under num_actors auto, the actors one GPU holds)",
    )

    @model_validator(mode="after")
    def _same_device(self) -> "RayConfig":
        if self.start_in_process is True and self.gpus_per_actor > 0:
            raise ValueError(
                "ray.start_in_process: true runs rounds on the driver's CPU, and ray.gpus_per_actor puts the actors "
                "on a GPU: the tables would differ (set it to auto or false)"
            )
        return self


@dataclass(frozen=True)
class Resources:
    """What a run's client actors take and how many it asks for, read from the `ray` section once
    (`RunConfig.resources`): sizing a run's actors (`actors/driver`), the clients of one actor
    call (`RunConfig.call_size`) and a Tune trial's bundles and concurrency (`tune/run.py`) all
    read it. `asked` is `ray.num_actors` (None under `auto`), `per_call` `ray.clients_per_call`
    (None under `auto`), `round_size` the clients a round trains."""

    cpus: float
    gpus: float
    asked: int | None
    per_call: int | None
    round_size: int

    @classmethod
    def of(cls, ray_cfg: RayConfig, round_size: int) -> Resources:
        asked = None if ray_cfg.num_actors == "auto" else ray_cfg.num_actors
        per_call = None if ray_cfg.clients_per_call == "auto" else ray_cfg.clients_per_call
        return cls(ray_cfg.cpus_per_actor, ray_cfg.gpus_per_actor, asked, per_call, round_size)

    @property
    def each(self) -> dict[str, float]:
        """One client actor's resources (its GPUs only where it takes some)."""
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus > 0 else {})}

    @property
    def planned(self) -> int:
        """The client actors a run plans for before it sees a cluster: `ray.num_actors`, or under
        `auto` the actors one GPU holds (GPU actors), else 1."""
        if self.asked is not None:
            return self.asked
        return max(1, math.floor(1 / self.gpus + 1e-9)) if self.gpus > 0 else 1

    @property
    def fewest(self) -> int:
        """The fewest client actors a run can go with: `ray.num_actors`, or under `auto` one."""
        return 1 if self.asked is None else self.asked

    @property
    def call_size(self) -> int:
        """Clients per actor call: `ray.clients_per_call`; under `auto` 5 on CPUs, and with GPUs
        the round's clients per `planned` actor, so a GPU actor trains its share of a round in one
        call, vectorized (`ray.vectorize: auto`)."""
        if self.per_call is not None:
            return self.per_call
        return 5 if self.gpus == 0 else math.ceil(self.round_size / self.planned)

    @property
    def torch_threads(self) -> int:
        """Torch threads of a client actor: floor(CPUs), at least 1 (Ray's own OMP_NUM_THREADS rule)."""
        return max(1, math.floor(self.cpus))

    def need(self, count: int) -> dict[str, float]:
        """What `count` client actors take together."""
        return {key: count * each for key, each in self.each.items()}

    def count(self, free: Mapping[str, float]) -> int:
        """The client actors of a run on a cluster with `free` resources: `ray.num_actors`, or under
        `auto` as many as `free` holds, at most the round's clients; `ConfigError` when not one fits."""
        if self.asked is not None:
            return self.asked
        size = min(self.round_size, *(math.floor(free.get(key, 0) / each + 1e-9) for key, each in self.each.items()))
        if size < 1:
            have = {key: free.get(key, 0) for key in ("CPU", "GPU")}
            raise ConfigError(
                f"ray: no room for one client actor (cpus_per_actor={self.cpus}, gpus_per_actor={self.gpus}; free "
                f"{have})"
            )
        return size

    def check_fits(self, count: int, limit: Mapping[str, float], grows: bool = False) -> None:
        """`ConfigError` naming `ray.num_actors` when `count` client actors can never be placed within
        `limit`: a fixed-size cluster's total resources, or (`grows`) the most an autoscaling
        cluster can grow to."""
        for key, need in self.need(count).items():
            have = float(limit.get(key, 0))
            if need > have + 1e-9:
                largest = " even at its largest" if grows else ""
                raise ConfigError(
                    f"ray.num_actors: {count} client actors x {self.each[key]:g} {key} need {need:g} {key}; "
                    f"the cluster has {have:g}{largest}"
                )

"""The `ray` section: where a run's actors come from and what each takes (docs/ray.md,
docs/config.md); `actors/` and `rayfl/engine` read it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .configbase import MAX_ACTORS, Strict


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
        description="where the coordinator runs: head (the head node), any, or the name of a custom resource the chosen nodes have",
    )
    coordinator_restarts: int = Field(
        3, ge=0, description="times Ray restarts a coordinator that died (its run resumes from the newest checkpoint)"
    )
    pool_idle_s: float = Field(
        300.0,
        ge=0,
        description="on a running cluster, the run's actors stay warm in the pool for the next run this long; 0: they leave with the run (docs/ray.md)",
    )
    vectorize: Literal["auto"] | Annotated[int, Field(ge=1)] = Field(
        "auto",
        description="train this many of a call's clients together in one batched computation (torch.func.vmap); auto: on a GPU client actor every client of a call that its memory share holds (where the algorithm and model allow it), else 1",
    )
    clients_per_call: Literal["auto"] | Annotated[int, Field(ge=1)] = Field(
        "auto",
        description="clients an actor trains per call, returning one partial sum; in-process runs group them alike, so results do not depend on the runner; auto: 5, or with gpus_per_actor the round's clients per actor (under num_actors auto, the actors one GPU holds)",
    )

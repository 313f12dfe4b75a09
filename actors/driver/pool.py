"""The warm pool from the driver's side: who borrows (`borrower`), the cluster's keeper
(`keeper`, started when missing) and the `rayfl pool status | drain` command. The keeper's own
process: `actors/keeper.py`."""

from __future__ import annotations

import time
from typing import Any, Callable

import ray
from ray.exceptions import ActorUnavailableError

from .. import names
from ..keeper import Keeper


def borrower() -> tuple[str, str]:
    """Who borrows: the actor this code runs in (a Tune trial's), else the driver's job."""
    ctx = ray.get_runtime_context()
    actor = ctx.get_actor_id()
    return ("actor", actor) if actor else ("job", ctx.get_job_id())


def keeper(create: bool = True) -> Any:
    """The cluster's keeper (started, detached, when missing and `create`); None when there is none."""
    if not create:
        try:
            return ray.get_actor(names.KEEPER, namespace=names.NAMESPACE)
        except ValueError:
            return None
    # on the head node, which lives as long as the cluster; restarted (empty) if its process dies
    return Keeper.options(
        name=names.KEEPER,
        namespace=names.NAMESPACE,
        lifetime="detached",
        scheduling_strategy="DEFAULT",
        resources={names.HEAD_RESOURCE: 0.001},
        max_restarts=-1,
        get_if_exists=True,
    ).remote()


KEEPER_WAIT_S = 60.0
"""Seconds a call to the keeper is asked again while Ray restarts it."""


def ask(call: Callable[[Any], Any], keep: Any = None) -> Any:
    """The answer to `call(keeper)` (a remote call), asked again while Ray restarts the keeper (its
    process died: its calls fail until the new one has read its books back), for at most
    `KEEPER_WAIT_S`."""
    deadline = time.monotonic() + KEEPER_WAIT_S
    while True:
        try:
            return ray.get(call(keep if keep is not None else keeper()))
        except ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def pool_command(action: str) -> str:
    """`rayfl pool status` (what is idle, what is leased) or `rayfl pool drain` (idle actors sent
    away), on the cluster this process joined; the lines to print."""
    keep = keeper(create=False)
    if keep is None:
        return "no warm pool on this cluster (no run has borrowed from it)"
    if action == "drain":
        gone, leased = ask(lambda k: k.drain.remote(), keep)
        return f"{gone} idle actors sent away; {leased} leased to runs still going"
    status = ask(lambda k: k.status.remote(), keep)
    lines = [f"{len(status['idle'])} idle, {sum(len(held['actors']) for held in status['leased'])} leased"]
    for e in status["idle"]:
        lines.append(
            f"  idle    {e['name']}  {e['kind']}  idle {e['idle_s']:.0f} s, leaves in {e['leaves_in_s']:.0f} s"
        )
    for held in status["leased"]:
        lines += [f"  leased  {name}  run {held['run']} ({held['borrower']})" for name in held["actors"]]
    return "\n".join(lines)

"""Warm actors on a running cluster: a run borrows its coordinator host and client actors from a
pool and hands them back clean when it ends, so the next run (a `rayfl run --address`, a job, a
Tune trial) skips Ray's worker start and torch's import and first-call set-up.

The pool is one detached actor per cluster, `rayfl:pool` in namespace `rayfl` (`Keeper`), that
books which warm actor is idle and which run holds it. Pooled actors are detached and named
`rayfl:pool:<role>-<hex>`; the pool keys them by what makes an actor reusable (`kinds`): the
project's code (a digest of its sources, with the Python, torch and Ray versions), the role, and
the actor's resources (CPUs and GPUs, which fix its device; for the coordinator, its node and
restarts). A run takes the idle actors of its kinds and starts new ones only where the pool is
short (idle actors of other kinds leave first, to free their resources). Handing back resets
each actor (`ClientActor.reset`, `Coordinator.reset`: no state of one run is visible to the next)
and marks it idle; an idle actor leaves after the `ray.pool_idle_s` of the run that used it last.
A run whose driver died (a killed `rayfl run`, a Tune trial's actor gone) never hands back: the
keeper notices (the Ray job or actor that borrowed is dead), tells its coordinator to abandon the
run, and the next borrower resets those actors before use.

Without a running cluster (a `rayfl run` that starts its own local cluster) or with
`ray.pool_idle_s: 0`, a run's actors are its own (`rayfl:<run>:coordinator`,
`rayfl:<run>:client-<k>`) and are killed when it ends, as are pooled actors that fail to reset.

This module imports Ray and the standard library only (the keeper needs no torch).
"""

from __future__ import annotations

import hashlib
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import ray

NAMESPACE = "rayfl"
"""Named actors live here, so the dashboard, `ray list actors` and `ray.get_actor` find them."""
KEEPER = "rayfl:pool"
HEAD_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node only."""
REAP_EVERY_S = 1.0


def actor_name(run_id: str, role: str) -> str:
    """A run's own actor, `rayfl:<run_id>:coordinator` or `rayfl:<run_id>:client-<k>`."""
    return f"rayfl:{run_id}:{role}"


def pooled_name(role: str) -> str:
    """A pooled actor, `rayfl:pool:<role>-<8 hex>`."""
    return f"{KEEPER}:{role}-{secrets.token_hex(4)}"


_DIGEST: list[str] = []


def code_digest() -> str:
    """What the actors run: the sources of `rayfl` and `actors` and the Python, torch and Ray
    versions, hashed (12 hex). An edited checkout never borrows actors running the old code."""
    if not _DIGEST:
        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha256(f"{sys.version}|{metadata.version('torch')}|{ray.__version__}".encode())
        for path in sorted([*root.joinpath("rayfl").rglob("*.py"), *root.joinpath("actors").rglob("*.py")]):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
        _DIGEST.append(h.hexdigest()[:12])
    return _DIGEST[0]


def kinds(cpus: float, gpus: float, node: str, restarts: int) -> tuple[str, str]:
    """The pool keys of (the coordinator host, a client actor) of a run with these resources."""
    digest = code_digest()
    return f"coordinator/{digest}/{node}/restarts={restarts}", f"client/{digest}/cpus={cpus:g}/gpus={gpus:g}"


def borrower() -> tuple[str, str]:
    """Who borrows: the actor this code runs in (a Tune trial's), else the driver's job."""
    ctx = ray.get_runtime_context()
    actor = ctx.get_actor_id()
    return ("actor", actor) if actor else ("job", ctx.get_job_id())


@dataclass
class Entry:
    kind: str
    name: str
    handle: Any
    resources: dict[str, float]
    since: float = 0.0  # idle since (monotonic)
    idle_s: float = 0.0  # leaves after this long idle
    dirty: bool = False  # its run never handed it back: reset before use
    placed: bool = True  # False while a new actor waits for resources


@dataclass
class Lease:
    borrower: tuple[str, str]
    run: str
    idle_s: float
    entries: list[Entry] = field(default_factory=list)


@ray.remote(num_cpus=0, max_concurrency=8)
class Keeper:
    """The pool's books: idle actors by kind, leases by id. A thread reclaims the actors of dead
    borrowers and sends idle actors away after their idle time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[Entry] = []  # most recently used last
        self.leases: dict[str, Lease] = {}
        threading.Thread(target=self._reap_forever, daemon=True).start()

    def take(
        self, lease: str, who: tuple[str, str], run: str, idle_s: float, wants: dict[str, int]
    ) -> tuple[str, list[tuple[str, str, Any, bool]]]:
        """Up to `wants[kind]` idle actors of each kind, booked under `lease`; where the pool is
        short, idle actors of other kinds are sent away to free their resources. Returns the
        run's key (`run`, with a suffix when a live lease has that name) and (kind, name, handle,
        dirty) of each actor."""
        with self.lock:
            self._reclaim()
            self._send_away(
                [e for e in self.idle if not fresh(e.handle)]
            )  # died, or restarted by Ray (its restarts spent)
            taken: list[Entry] = []
            for kind, count in wants.items():
                mine = [e for e in reversed(self.idle) if e.kind == kind][:count]
                taken += mine
            for e in taken:
                self.idle.remove(e)
            if len(taken) < sum(wants.values()):
                self._send_away([e for e in self.idle if e.kind not in wants])
            key = run if all(held.run != run for held in self.leases.values()) else f"{run}-{secrets.token_hex(2)}"
            self.leases[lease] = Lease(who, key, idle_s, taken)
            return key, [(e.kind, e.name, e.handle, e.dirty) for e in taken]

    def join(self, lease: str, entries: list[tuple[str, str, Any, dict[str, float]]]) -> None:
        """Actors the borrower started (the pool was short) join its lease."""
        with self.lock:
            self.leases[lease].entries += [
                Entry(kind, name, handle, resources, placed=False) for kind, name, handle, resources in entries
            ]

    def give_back(self, lease: str, clean: list[str]) -> bool:
        """The lease ends: the actors named in `clean` (reset by the borrower) become idle; the
        others, and all of them under an idle time of 0, leave. False: no such lease (this
        keeper restarted and lost its books; the borrower sends its actors away itself)."""
        with self.lock:
            held = self.leases.pop(lease, None)
            if held is None:
                return False
            now = time.monotonic()
            keep = [e for e in held.entries if e.name in clean and held.idle_s > 0]
            self._send_away([e for e in held.entries if e not in keep])
            for e in keep:
                e.since, e.idle_s, e.dirty = now, held.idle_s, False
            self.idle += keep
            self._make_room()
            return True

    def idle_resources(self) -> dict[str, float]:
        """CPUs and GPUs the idle actors hold (free for a borrower: they leave when it is short)."""
        with self.lock:
            self._reclaim()
            out: dict[str, float] = {}
            for e in self.idle:
                for key, value in e.resources.items():
                    out[key] = out.get(key, 0.0) + value
            return out

    def status(self) -> dict[str, Any]:
        """Idle actors (kind, name, seconds idle, seconds left) and leases (run, borrower, names)."""
        with self.lock:
            self._reclaim()
            now = time.monotonic()
            return {
                "idle": [
                    {
                        "kind": e.kind,
                        "name": e.name,
                        "idle_s": now - e.since,
                        "leaves_in_s": max(0.0, e.idle_s - (now - e.since)),
                    }
                    for e in self.idle
                ],
                "leased": [
                    {"run": held.run, "borrower": ":".join(held.borrower), "actors": [e.name for e in held.entries]}
                    for held in self.leases.values()
                ],
            }

    def drain(self) -> tuple[int, int]:
        """Send every idle actor away; returns (sent away, still leased)."""
        with self.lock:
            self._reclaim()
            gone = len(self.idle)
            self._send_away(list(self.idle))
            return gone, sum(len(held.entries) for held in self.leases.values())

    def _send_away(self, entries: list[Entry]) -> None:
        for e in entries:
            if e in self.idle:
                self.idle.remove(e)
            ray.kill(e.handle, no_restart=True)

    def _reclaim(self) -> None:
        """Leases whose borrower died: their coordinators abandon the run, the actors turn idle (dirty)."""
        from ray._private import state

        live_jobs = (
            {job["JobID"] for job in state.jobs() if not job["IsDead"]}
            if any(h.borrower[0] == "job" for h in self.leases.values())
            else set()
        )
        dead = [lease for lease, held in self.leases.items() if not alive(held.borrower, live_jobs)]
        now = time.monotonic()
        for lease in dead:
            held = self.leases.pop(lease)
            for e in held.entries:
                if e.kind.startswith("coordinator/"):
                    e.handle.abandon.remote(held.run)
                e.since, e.idle_s, e.dirty = now, held.idle_s, True
            self.idle += held.entries

    def _reap_forever(self) -> None:
        while True:
            time.sleep(REAP_EVERY_S)
            with self.lock:
                try:
                    self._reclaim()
                    now = time.monotonic()
                    self._send_away([e for e in self.idle if now - e.since >= e.idle_s])
                    self._make_room()
                except Exception:  # noqa: BLE001 - the GCS busy or restarting: next time
                    pass

    def _make_room(self) -> None:
        """While a borrower's new actor waits for resources, idle actors hold none."""
        from ray._private import state

        waiting = [e for held in self.leases.values() for e in held.entries if not e.placed]
        for e in waiting:
            e.placed = state.actors(e.handle._actor_id.hex()).get("State") not in (
                "PENDING_CREATION",
                "DEPENDENCIES_UNREADY",
            )
        if any(not e.placed for e in waiting):
            self._send_away(list(self.idle))


def fresh(handle: Any) -> bool:
    """Whether a pooled actor is alive and was never restarted: a coordinator's restarts are a
    run's budget (`ray.coordinator_restarts`), never spent by an earlier run."""
    from ray._private import state

    info = state.actors(handle._actor_id.hex())
    return info.get("State") == "ALIVE" and int(info.get("NumRestarts", 0)) == 0


def alive(who: tuple[str, str], live_jobs: set[str]) -> bool:
    """Whether the Ray job (one of `live_jobs`) or actor (read from the GCS's table) that borrowed still runs."""
    from ray._private import state

    role, hex_id = who
    if role == "actor":
        return state.actors(hex_id).get("State") not in ("DEAD", None)
    return hex_id in live_jobs


def keeper(create: bool = True) -> Any:
    """The cluster's keeper (started, detached, when missing and `create`); None when there is none."""
    if not create:
        try:
            return ray.get_actor(KEEPER, namespace=NAMESPACE)
        except ValueError:
            return None
    # on the head node, which lives as long as the cluster; restarted (empty) if its process dies
    return Keeper.options(
        name=KEEPER,
        namespace=NAMESPACE,
        lifetime="detached",
        scheduling_strategy="DEFAULT",
        resources={HEAD_RESOURCE: 0.001},
        max_restarts=-1,
        get_if_exists=True,
    ).remote()


def pool_command(action: str) -> str:
    """`rayfl pool status` (what is idle, what is leased) or `rayfl pool drain` (idle actors sent
    away), on the cluster this process joined; the lines to print."""
    keep = keeper(create=False)
    if keep is None:
        return "no warm pool on this cluster (no run has borrowed from it)"
    if action == "drain":
        gone, leased = ray.get(keep.drain.remote())
        return f"{gone} idle actors sent away; {leased} leased to runs still going"
    status = ray.get(keep.status.remote())
    lines = [f"{len(status['idle'])} idle, {sum(len(held['actors']) for held in status['leased'])} leased"]
    for e in status["idle"]:
        lines.append(
            f"  idle    {e['name']}  {e['kind']}  idle {e['idle_s']:.0f} s, leaves in {e['leaves_in_s']:.0f} s"
        )
    for held in status["leased"]:
        lines += [f"  leased  {name}  run {held['run']} ({held['borrower']})" for name in held["actors"]]
    return "\n".join(lines)

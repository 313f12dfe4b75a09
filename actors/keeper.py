"""The warm pool's keeper: one detached actor per cluster, `rayfl:pool` in namespace `rayfl`, on the
head node, that books which pooled actor is idle and which run holds it (its process runs no
client and no federation; it needs no torch).

A run on a running cluster borrows its coordinator host and client actors from the pool (the
driver's side: `actors/driver/pool.py`, `actors/driver/crew.py`) and hands them back reset when
it ends. Pooled actors are detached and named `rayfl:pool:<role>-<hex>`; the pool keys them by what
makes an actor reusable (`names.kinds`). A run takes the idle actors of its kinds and starts new
ones only where the pool is short (idle actors of other kinds leave first, to free their
resources). An idle actor leaves after the `ray.pool_idle_s` of the run that used it last. A run
whose borrower died (a killed `rayfl run`, a Tune trial's actor gone) never hands back: a thread
notices (the Ray job or actor that borrowed is dead), tells its coordinator to abandon the run,
and the next borrower resets those actors before use.

The books outlive the keeper's process: every change is written to the GCS's key-value store
(`BOOKS`), and a keeper that Ray restarts (its process killed) reads them back, finding each
pooled actor again by its name (they are named and detached), so idle actors stay lendable,
leases stay held and `rayfl pool` sees them all. A pooled actor in no book (its keeper died
before the borrower that started it joined it to its lease) is sent away after `ORPHAN_GRACE_S`.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from . import names, raystate

REAP_EVERY_S = 1.0
"""Seconds between the keeper's checks of borrowers and idle times."""
ORPHAN_GRACE_S = 30.0
"""Seconds a pooled actor may stay in no book (started, not yet joined to its lease) before it is sent away."""
BOOKS = "rayfl:pool:books"
"""The key of the keeper's books in the GCS's key-value store."""


@dataclass
class Entry:
    kind: str
    name: str
    handle: Any
    resources: dict[str, float]
    since: float = 0.0  # idle since (time.time(): it outlives the keeper's process)
    idle_s: float = 0.0  # leaves after this long idle
    dirty: bool = False  # its run never handed it back: reset before use
    placed: bool = True  # False while a new actor waits for resources


@dataclass
class Lease:
    borrower: tuple[str, str]
    run: str
    idle_s: float
    entries: list[Entry] = field(default_factory=list)


@dataclass(frozen=True)
class Lent:
    """A pooled actor `Keeper.take` lends a run: its kind, name and handle, and whether it must be
    reset before use (`dirty`: the run that had it last never handed it back)."""

    kind: str
    name: str
    handle: Any
    dirty: bool


@dataclass(frozen=True)
class Started:
    """An actor a run started for the pool (it was short), joining the run's lease (`Keeper.join`):
    by name, never by handle (`Keeper.join` says why), with the resources it holds."""

    kind: str
    name: str
    resources: dict[str, float]


@ray.remote(num_cpus=0, max_concurrency=8)
class Keeper:
    """The pool's books: idle actors by kind, leases by id. A thread reclaims the actors of dead
    borrowers and sends idle actors away after their idle time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[Entry] = []  # most recently used last
        self.leases: dict[str, Lease] = {}
        self.unbooked: dict[str, float] = {}  # pooled actors in no book: when first seen
        self.written = b""  # the books as last written to the GCS
        self._read_books()
        threading.Thread(target=self._reap_forever, daemon=True).start()

    def take(
        self, lease: str, who: tuple[str, str], run: str, idle_s: float, wants: dict[str, int]
    ) -> tuple[str, list[Lent]]:
        """Up to `wants[kind]` idle actors of each kind, booked under `lease`; where the pool is
        short, idle actors of other kinds are sent away to free their resources. Returns the
        run's key (`run`, with a suffix when a live lease has that name) and the actors lent."""
        with self.lock:
            self._reclaim()
            self._send_away(
                [e for e in self.idle if not raystate.fresh(e.handle)]
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
            self._write_books()
            return key, [Lent(e.kind, e.name, e.handle, e.dirty) for e in taken]

    def join(self, lease: str, entries: list[Started]) -> None:
        """Actors the borrower started (the pool was short) join its lease, each found by its name
        under the keeper's lock. Never passed as handles: the
        first handle of a class this process unpacks imports its module (torch, for a client
        actor), which on a loaded machine took longer than `ORPHAN_GRACE_S` before the method
        ran, while the reaper sent the new actors away as orphans. Under the lock the reaper
        waits for the lookups."""
        with self.lock:
            held = self.leases[lease]
            booked = {e.name for e in held.entries}  # a call asked again (the keeper restarting) joins nothing twice
            held.entries += [
                Entry(e.kind, e.name, handle, e.resources, placed=False)
                for e in entries
                if e.name not in booked
                for handle in found(e.name)
            ]
            self._write_books()

    def give_back(self, lease: str, clean: list[str]) -> bool:
        """The lease ends: the actors named in `clean` (reset by the borrower) become idle; the
        others, and all of them under an idle time of 0, leave. False: no such lease (this
        keeper restarted and lost its books; the borrower sends its actors away itself)."""
        with self.lock:
            held = self.leases.pop(lease, None)
            if held is None:
                return False
            now = time.time()
            keep = [e for e in held.entries if e.name in clean and held.idle_s > 0]
            self._send_away([e for e in held.entries if e not in keep])
            for e in keep:
                e.since, e.idle_s, e.dirty = now, held.idle_s, False
            self.idle += keep
            self._make_room()
            self._write_books()
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
            now = time.time()
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
            self._write_books()
            return gone, sum(len(held.entries) for held in self.leases.values())

    def _send_away(self, entries: list[Entry]) -> None:
        for e in entries:
            if e in self.idle:
                self.idle.remove(e)
            ray.kill(e.handle, no_restart=True)

    def _reclaim(self) -> None:
        """Leases whose borrower died: their coordinators abandon the run, the actors turn idle (dirty)."""
        live_jobs = raystate.live_jobs() if any(h.borrower[0] == "job" for h in self.leases.values()) else set()
        dead = [lease for lease, held in self.leases.items() if not alive(held.borrower, live_jobs)]
        now = time.time()
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
                    now = time.time()
                    self._send_away([e for e in self.idle if now - e.since >= e.idle_s])
                    self._make_room()
                    self._send_away_orphans(now)
                    self._write_books()
                except Exception:  # noqa: BLE001 - the GCS busy or restarting: next time
                    pass

    def _make_room(self) -> None:
        """While a borrower's new actor waits for resources, idle actors hold none."""
        waiting = [e for held in self.leases.values() for e in held.entries if not e.placed]
        for e in waiting:
            pending = raystate.waiting(e.handle)
            e.placed = e.placed if pending is None else not pending  # unknown: asked again next time
        if any(not e.placed for e in waiting):
            self._send_away(list(self.idle))

    def _write_books(self) -> None:
        """The books (names, not handles) to the GCS's key-value store."""
        fields = [f.name for f in dataclasses.fields(Entry) if f.name != "handle"]
        entry = lambda e: {name: getattr(e, name) for name in fields}
        books = {
            "idle": [entry(e) for e in self.idle],
            "leases": {
                lease: {
                    "borrower": list(held.borrower),
                    "run": held.run,
                    "idle_s": held.idle_s,
                    "entries": [entry(e) for e in held.entries],
                }
                for lease, held in self.leases.items()
            },
        }
        written = json.dumps(books).encode()
        if written != self.written:  # the reaper asks every second: the GCS is written on a change only
            raystate.kv_put(BOOKS, written, names.NAMESPACE)
            self.written = written

    def _read_books(self) -> None:
        """The books a previous keeper of this cluster wrote, each actor found again by its name
        (one that is gone is left out)."""
        saved = raystate.kv_get(BOOKS, names.NAMESPACE)
        if not saved:
            return
        books = json.loads(saved)

        again = lambda fields: [Entry(**fields, handle=handle) for handle in found(fields["name"])]
        self.idle = [e for fields in books["idle"] for e in again(fields)]
        for lease, held in books["leases"].items():
            entries = [e for fields in held["entries"] for e in again(fields)]
            self.leases[lease] = Lease(tuple(held["borrower"]), held["run"], held["idle_s"], entries)

    def _send_away_orphans(self, now: float) -> None:
        """Pooled actors in no book for `ORPHAN_GRACE_S` are sent away."""
        named = raystate.named_actors(names.NAMESPACE, f"{names.KEEPER}:")
        if named is None:
            return
        booked = {e.name for e in self.idle} | {e.name for held in self.leases.values() for e in held.entries}
        self.unbooked, due = overdue(self.unbooked, named - booked, now)
        for name in due:
            try:
                ray.kill(ray.get_actor(name, namespace=names.NAMESPACE), no_restart=True)
            except ValueError:  # gone meanwhile
                pass


def overdue(unbooked: dict[str, float], orphans: set[str], now: float) -> tuple[dict[str, float], list[str]]:
    """The pooled actors in no book (`orphans`) with when each was first seen (`unbooked`, carried
    from the last look), and those of them unbooked for `ORPHAN_GRACE_S` or more, to send away."""
    seen = {name: unbooked.get(name, now) for name in orphans}
    due = sorted(name for name, since in seen.items() if now - since >= ORPHAN_GRACE_S)
    return {name: since for name, since in seen.items() if name not in due}, due


def found(name: str) -> list[Any]:
    """The handle of the pooled actor `name`, in a list; empty when it is gone."""
    try:
        return [ray.get_actor(name, namespace=names.NAMESPACE)]
    except ValueError:
        return []


def alive(who: tuple[str, str], live_jobs: set[str]) -> bool:
    """Whether the Ray job (one of `live_jobs`) or actor that borrowed still runs."""
    role, hex_id = who
    return raystate.running(hex_id) if role == "actor" else hex_id in live_jobs

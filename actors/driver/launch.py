"""A run's actors, from the driver: its coordinator host and client actors, borrowed from the
cluster's warm pool (`actors/keeper.py`) or started for the run alone, waited for until they
answer, and given back (or killed) when the run ends, however it ends.

How many client actors and what each takes is the config's `Resources` (`RunConfig.resources`),
read once: `ray.num_actors`, or under `auto` as many as the free resources and the pool's idle
actors hold.
"""

from __future__ import annotations

import copy
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from rayfl.config import ConfigError, RunConfig
from rayfl.engine import Federation, Paused, Progress, Start
from rayfl.runner import run_in_process

from .. import raystate
from ..client import ClientActor
from ..coordinator.actor import Coordinator, Duty
from ..coordinator.dashboard import DashboardMetrics
from ..names import HEAD_RESOURCE, NAMESPACE, actor_name, kinds, pooled_name
from . import pool
from .cluster import check_fits_here, connect
from .follow import Cancelled, ClusterGone, answer, follow

log = logging.getLogger("rayfl")


def launch(
    fed: Federation,
    start: Start,
    run_dir: Path,
    run_id: str,
    address: str | None,
    progress: Progress | None,
    phase: Callable[[str], None],
) -> dict[str, Any]:
    """The rounds of `fed` from `start` on Ray: join the running cluster at `address` (resolved by
    `head.joining` before Ray was imported) or start a local one, gather
    the run's actors and wait until they answer (the federation in the object store once), follow
    the coordinator to the end, give the actors back; the run's summary. Under
    `ray.start_in_process` (`starts_in_process`) the rounds begin in this process meanwhile and
    move onto the actors at the first round boundary after they answer (`hands_over`); a run
    that ends first stops the cluster half started, and one on a local cluster of its own whose
    rounds left take less than its actors' start starts none (`starts_actors`) and publishes its
    rows on the dashboard's series itself. `phase(name)` marks the end of `ray_start`
    (or of the rounds run here, `in_process`), `actors`, `rounds` and `shutdown`."""
    config = fed.config
    running = ray.is_initialized() or bool(address)
    if not running:
        check_fits_here(config)
    up = BringUp(fed, run_dir, run_id, address, pooled=running and config.ray.pool_idle_s > 0, own=not running)
    try:
        if starts_in_process(config, running):
            begun = copy.deepcopy(fed)  # the rounds here change its caches; the actors get it as built
            first = start.state.round + 1
            here = up.begin(start, progress)
            up.start()
            try:
                summary = run_in_process(
                    begun, start, run_dir, here, lambda r: not up.stays and hands_over(r, up.ready())
                )
                if up.own:
                    up.done.wait()  # whether it stays is decided (close waits for Ray's start anyway)
                if up.stays:
                    up.publish()  # the rows before it was decided (after the last round, say)
                phase("in_process")
                return summary
            except Paused as paused:
                start = paused.start
                up.wanted.set()
            except ConfigError:
                raise
            except Exception as exc:
                raise RoundsFailed(exc) from exc
            phase("in_process")
            up.done.wait()  # answered already, unless `hands_over` moved before
            up.check()
            here = f"round {first}" if first == start.state.round else f"rounds {first}-{start.state.round}"
            log.info(f"{here} ran in this process while the actors came up; the actors run the rest")
        else:
            up.run(phase)
            up.check()
        phase("actors")
        summary = follow(up.crew.coordinator, up.duty, start, progress, config.ray.actor_timeout_s)
        phase("rounds")
        return summary
    except ClusterGone:
        up.gone = True  # no actor to hand back, no cluster to leave: Ray's calls would wait for its GCS
        raise
    finally:
        up.close()
        phase("shutdown")


class RoundsFailed(Exception):
    """The rounds begun in this process raised (`cause`): the run's own error, as the coordinator's
    would be on Ray."""

    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


def starts_in_process(config: RunConfig, running: bool) -> bool:
    """Whether the run begins in this process (`ray.start_in_process`): under `auto` when it starts
    a local cluster of its own and its actors train on the CPU, as this process does."""
    wanted = config.ray.start_in_process
    return wanted is True or (wanted == "auto" and not running and config.ray.gpus_per_actor == 0)


ACTOR_START_CPU_S = 3.0
"""CPU seconds an actor process takes to start (Python, torch, rayfl imported), measured on the
2-core machine (docs/ray.md, "Rounds begun in the driver")."""


def starts_actors(rounds_left: int, seconds_per_round: float, actors: int, cpus: float) -> bool:
    """Whether a run begun in this process on a local cluster of its own starts its actors once
    Ray is up: only when its rounds left, at this process's pace, outlast its actors' start
    (`actors` client actors and the coordinator importing on the cluster's `cpus` but the one
    this process's rounds take). A run shorter than that would only be slowed down by them (they
    share its cores) and finishes here."""
    return rounds_left * seconds_per_round > ACTOR_START_CPU_S * (actors + 1) / max(1.0, cpus - 1)


def hands_over(round: int, ready: bool) -> bool:
    """Whether a run begun in this process moves onto the actors after `round`: as soon as they
    answer (`ready`). (The tests move at a chosen round instead, waiting there for the actors.)"""
    return ready


class BringUp(threading.Thread):
    """A run's cluster and actors brought up: connected (or a local cluster started), the crew
    gathered, the federation put in the object store once, every actor warmed; in this thread
    (`run`) or beside the rounds that begin in this process (`start`). `close` stops it where it
    is, hands the actors back and leaves the cluster, however the run ended.

    Started beside the rounds, the thread lives until `close`, and leaves the cluster itself: the
    processes of a local cluster that it started end with it (Ray starts them with Linux's
    `PR_SET_PDEATHSIG`, which fires when the thread that started them ends, not the process)."""

    def __init__(self, fed: Federation, run_dir: Path, run_id: str, address: str | None, pooled: bool, own: bool):
        super().__init__(name="rayfl-bring-up", daemon=True)
        self.fed, self.run_dir, self.run_id, self.address, self.pooled = fed, run_dir, run_id, address, pooled
        self.own = own  # a local cluster of the run's own: no actor of it is up yet
        self.connected, self.gone = False, False
        self.stays = False  # the run begun here finishes here: no actor starts (`starts_actors`)
        self.crew: Crew | None = None
        self.duty: Duty | None = None
        self.error: BaseException | None = None
        self.done, self.cancelled, self.leave = threading.Event(), threading.Event(), threading.Event()
        self.wanted = threading.Event()  # the run begun here waits for its actors
        self.rows: list[Mapping[str, Any]] = []  # the rows of the rounds begun here
        self.times: list[float] = []  # when each was passed on
        self.passed = threading.Condition()  # one more was
        self.left = 0  # rounds the run had left when they began here
        self.series: DashboardMetrics | None = None
        self.published, self.wall_time_s = 0, 0.0

    def begin(self, start: Start, progress: Progress | None) -> Progress:
        """The rounds begin in this process from `start`: the progress callback that passes their
        rows on to `progress`, counts them (this process's pace) and, when the run stays here,
        publishes them on the dashboard's series, as the coordinator does for its rounds."""
        self.left = self.fed.config.federation.rounds - start.state.round
        recorded = start.recorder.rounds
        self.wall_time_s = recorded[-1]["wall_time_s"] if recorded else 0.0  # a resumed run's published already

        def seen(row: Mapping[str, Any]) -> None:
            with self.passed:
                self.times.append(time.monotonic())
                self.rows.append(row)
                self.passed.notify_all()
            if self.stays:
                self.publish()
            if progress is not None:
                progress(row)

        return seen

    def publish(self) -> None:
        """The rows not published yet, on the dashboard's series (in the run's thread)."""
        if self.series is None:
            self.series = DashboardMetrics(self.run_id, self.fed.config.algorithm.name, self.wall_time_s)
        for row in self.rows[self.published :]:
            self.series.record(row, 0)
        self.published = len(self.rows)

    def ready(self) -> bool:
        """Whether the run begun here moves onto the actors now: they answer (or the bring-up failed)."""
        return self.done.is_set() and not self.stays

    def _stays(self) -> bool:
        """Whether the run begun here finishes here (`starts_actors`), decided once Ray is up from
        the pace of the first round this process began after that (the rounds during Ray's start
        run at half the pace or less, measured); the actors start sooner when the round going on
        has run long enough since Ray came up to say so. Logs why the run stays."""
        whole = ray.cluster_resources()  # the run's own: all of it free for its actors
        actors, cpus = self.fed.config.resources.count(whole), whole.get("CPU", 1.0)
        up = time.monotonic()
        timed = len(self.rows) + 2  # the round going on now, then one begun with Ray up
        with self.passed:
            while len(self.rows) < min(timed, self.left):
                if self.wanted.is_set():  # moved all the same (the tests move at a round of their choice)
                    return False
                going = time.monotonic() - max(up, self.times[-1] if self.times else up)  # at least its pace
                if starts_actors(self.left - len(self.rows) - 1, going, actors, cpus):
                    return False
                if self.cancelled.is_set():
                    raise Cancelled()
                self.passed.wait(0.05)
        if timed >= self.left:
            return True  # the rounds are over before one was timed: the run ends here
        left, pace = self.left - timed, self.times[timed - 1] - self.times[timed - 2]
        if starts_actors(left, pace, actors, cpus):
            return False
        log.info(
            f"the run finishes in this process: its {left} rounds left take about {left * pace:.0f} s here, less "
            "than its actors' start"
        )
        return True

    def run(self, phase: Callable[[str], None] = lambda name: None) -> None:
        config = self.fed.config
        try:
            self.connected = connect(self.address, config.ray.dashboard)
            phase("ray_start")
            self._cancelled()
            self.stays = self.own and threading.current_thread() is self and self._stays()  # beside the rounds
            if not self.stays:
                self.crew = gather(config, self.run_id, self.pooled)
                self._cancelled()
                self.duty = Duty([ray.put(self.fed)], self.crew.clients, str(self.run_dir), self.crew.key)
                coordinator_ready = self.crew.coordinator.warm.remote(self.duty)
                wait_for_actors(
                    self.crew.clients,
                    config.ray.actor_timeout_s,
                    log.info,
                    federation_ref=self.duty.federation_box[0],
                    stop=self.cancelled,
                )
                answer(coordinator_ready, every_s=0.5, stop=self.cancelled)
        except BaseException as exc:  # raised in the run's thread by `check`
            self.error = exc
        finally:
            self.done.set()
        if threading.current_thread() is self:
            self.leave.wait()
            self._leave_cluster()

    def _cancelled(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled()

    def check(self) -> None:
        """Raise what stopped the bring-up, if anything did."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.cancelled.set()
        beside = self.ident is not None  # started as a thread
        try:
            if beside:
                self.done.wait()  # Ray's start is not interrupted: a local cluster half started is left whole
            self.gone = self.gone or isinstance(self.error, ClusterGone)
            if self.crew is not None and not self.gone:
                release(self.crew, self.fed.config.ray.actor_timeout_s)
        finally:  # the cluster is left whatever happened above (a second Ctrl-C included)
            self.leave.set()
            if beside:
                self.join()
            else:
                self._leave_cluster()

    def _leave_cluster(self) -> None:
        if self.connected and not self.gone:
            ray.shutdown()


@dataclass
class Crew:
    """The coordinator (first in `names`) and the client actors of one run; `lease` names its
    booking in the pool, None for actors of this run alone."""

    coordinator: Any
    clients: list
    names: list[str]
    key: str
    lease: str | None = None


def gather(config: RunConfig, run_id: str, pooled: bool) -> Crew:
    """The run's actors: `ray.num_actors` client actors (under `auto`, as many as the free
    resources and the pool's idle actors hold; `ConfigError` when the asked number can never fit
    the cluster, or `ray.coordinator_node` names a resource no node has) and a coordinator host.
    `pooled`: the pool's idle actors of the run's kinds first, new pooled ones for the rest;
    else new ones named after the run (a suffix when a live run has that name: RUN_DIRs a/run
    and b/run)."""
    room = dict(ray.available_resources())
    keeper = pool.keeper() if pooled else None
    if keeper is not None:
        for key, value in pool.ask(lambda k: k.idle_resources.remote(), keeper).items():
            room[key] = room.get(key, 0.0) + value
    resources = config.resources
    count = resources.count(room)
    most = raystate.max_resources()
    resources.check_fits(count, ray.cluster_resources() if most is None else most, grows=most is not None)
    node = config.ray.coordinator_node
    if node not in ("head", "any") and node not in ray.cluster_resources():
        raise ConfigError(f"ray.coordinator_node: no node of the cluster has a resource {node!r}")
    if keeper is None:
        return own_crew(config, run_id, count)
    return borrowed_crew(config, run_id, count, keeper)


def own_crew(config: RunConfig, key: str, count: int) -> Crew:
    own = [actor_name(key, "coordinator"), *(actor_name(key, f"client-{k}") for k in range(count))]
    try:
        clients = create_client_actors(config, own[1:], pooled=False)
    except ray.exceptions.ActorAlreadyExistsError:  # a run of that name is live on the cluster
        return own_crew(config, f"{key}-{secrets.token_hex(2)}", count)
    coordinator = Coordinator.options(**coordinator_options(config, own[0], pooled=False)).remote()
    return Crew(coordinator, clients, own, key)


def borrowed_crew(config: RunConfig, run_id: str, count: int, keeper: Any) -> Crew:
    """Idle pooled actors of the run's kinds, new pooled ones where the pool is short; those a
    dead run left behind are reset first (its coordinator was told to stop: its reset waits for
    that, before the clients are reset behind any task still running on them)."""
    ray_cfg = config.ray
    kind_coordinator, kind_client = kinds(
        ray_cfg.cpus_per_actor, ray_cfg.gpus_per_actor, ray_cfg.coordinator_node, ray_cfg.coordinator_restarts
    )
    lease = secrets.token_hex(8)
    who, wants = pool.borrower(), {kind_coordinator: 1, kind_client: count}
    key, taken = pool.ask(lambda k: k.take.remote(lease, who, run_id, ray_cfg.pool_idle_s, wants), keeper)
    try:
        return completed(config, taken, count, keeper, lease, key, (kind_coordinator, kind_client))
    except BaseException:  # the lease ends with the error: its actors leave (never handed back half reset)
        keeper.give_back.remote(lease, [])
        raise


def completed(
    config: RunConfig, taken: list, count: int, keeper: Any, lease: str, key: str, kinds: tuple[str, str]
) -> Crew:
    """The crew from the pool's actors `taken`, and new ones for what they lack (joined to the lease)."""
    kind_coordinator, kind_client = kinds
    coordinator = [(name, handle, dirty) for kind, name, handle, dirty in taken if kind == kind_coordinator]
    clients = [(name, handle, dirty) for kind, name, handle, dirty in taken if kind == kind_client]
    if coordinator and coordinator[0][2]:
        ray.get(coordinator[0][1].reset.remote())
    ray.get([handle.reset.remote() for _, handle, was in clients if was])
    new = []
    if not coordinator:
        name = pooled_name("coordinator")
        coordinator = [(name, Coordinator.options(**coordinator_options(config, name, pooled=True)).remote(), False)]
        new.append((kind_coordinator, name, {}))
    fresh = [pooled_name("client") for _ in range(count - len(clients))]
    for name, handle in zip(fresh, create_client_actors(config, fresh, pooled=True)):
        clients.append((name, handle, False))
        new.append((kind_client, name, config.resources.each))
    if new:
        pool.ask(lambda k: k.join.remote(lease, new), keeper)
    crew = [*coordinator, *clients]
    return Crew(coordinator[0][1], [h for _, h, _ in clients], [n for n, _, _ in crew], key, lease)


def release(crew: Crew, timeout_s: float) -> None:
    """The run ended (however it ended): its own actors are killed; borrowed ones are reset (the
    coordinator first: its run, if still going, stops) and handed back, those that did not reset
    within `timeout_s` sent away."""
    actors = [crew.coordinator, *crew.clients]
    if crew.lease is None:
        for actor in actors:
            ray.kill(actor)
        return
    clean: list[str] = []
    try:
        ray.get(crew.coordinator.reset.remote(), timeout=timeout_s)
        clean.append(crew.names[0])
        resets = {a.reset.remote(): name for a, name in zip(crew.clients, crew.names[1:])}
        done, _ = ray.wait(list(resets), num_returns=len(resets), timeout=timeout_s)
        for ref in done:
            try:
                ray.get(ref)
                clean.append(resets[ref])
            except ray.exceptions.RayError:
                pass
    except ray.exceptions.RayError:
        pass
    finally:
        if not pool.ask(lambda k: k.give_back.remote(crew.lease, clean)):
            for actor in actors:
                ray.kill(actor, no_restart=True)


def create_client_actors(config: RunConfig, names: list[str], pooled: bool) -> list[ray.actor.ActorHandle]:
    """Client actors under `names`, restartable (a killed actor comes back and the executor
    retries its task); `pooled` ones detached and placed outside any placement group (a Tune
    trial's), to outlive the run (the warm pool). Each reads the federation (dataset, partition,
    client procedure) from the object store with its run's first task: no constructor argument
    lives in the object store, which Ray cannot guarantee across restarts (ray-project/ray#53727)."""
    ray_cfg = config.ray
    options: dict[str, Any] = dict(
        num_cpus=ray_cfg.cpus_per_actor,
        num_gpus=ray_cfg.gpus_per_actor,
        max_restarts=-1,
        max_task_retries=0,
        namespace=NAMESPACE,
    )
    if pooled:
        options.update(lifetime="detached", scheduling_strategy="DEFAULT")
    threads = config.resources.torch_threads
    return [ClientActor.options(name=name, **options).remote(threads, ray_cfg.gpus_per_actor) for name in names]


def coordinator_options(config: RunConfig, name: str, pooled: bool) -> dict[str, Any]:
    """Where the coordinator runs (`ray.coordinator_node`: the head node by default, where losing
    it is least likely) and how often Ray restarts it (`ray.coordinator_restarts`). A run's own
    coordinator inside a placement group (a Tune trial's) is placed by the group: its bundles
    hold no node resource; a pooled one is detached and placed outside any group."""
    node = config.ray.coordinator_node
    placed_by_group = not pooled and ray.util.get_current_placement_group() is not None
    resources = {} if node == "any" or placed_by_group else {HEAD_RESOURCE if node == "head" else node: 0.001}
    where = dict(lifetime="detached", scheduling_strategy="DEFAULT") if pooled else {}
    return dict(
        name=name,
        namespace=NAMESPACE,
        num_cpus=0,
        resources=resources,
        max_restarts=config.ray.coordinator_restarts,
        max_task_retries=0,
        **where,
    )


def wait_for_actors(
    actors: Sequence[ray.actor.ActorHandle],
    timeout_s: float,
    report: Callable[[str], None],
    every_s: float = 5.0,
    federation_ref: ray.ObjectRef | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Block until every client actor is up (and, given the federation, warmed: `ClientActor.warm`),
    reporting what is still pending every `every_s` seconds (actors that fit the cluster may wait
    for free resources or new nodes); `RuntimeError` after `timeout_s` (`ray.actor_timeout_s`). An
    actor that dies meanwhile is asked again once Ray restarted it; one whose constructor failed
    raises here; `Cancelled` within half a second of `stop`."""
    call = (lambda a: a.info.remote()) if federation_ref is None else (lambda a: a.warm.remote([federation_ref]))
    owner = {call(a): a for a in actors}
    started = reported = time.monotonic()
    while True:
        ready, _ = ray.wait(list(owner), num_returns=len(owner), timeout=every_s if stop is None else 0.5)
        if stop is not None and stop.is_set():
            raise Cancelled()
        for ref in ready:
            actor = owner.pop(ref)
            try:
                ray.get(ref)
            except ActorUnavailableError:  # killed while it warmed up, or restarting: ask it again
                owner[call(actor)] = actor
            except RayActorError as exc:  # dead for good (its constructor failed, or no restarts left)
                raise RuntimeError(
                    f"client actor {actors.index(actor)} died while starting ({type(exc).__name__})"
                ) from None
        if not owner:
            return
        waited = time.monotonic() - started
        available = ray.available_resources()
        free = {k: round(available.get(k, 0.0), 3) for k in ("CPU", "GPU") if k in ray.cluster_resources()}
        if waited >= timeout_s:
            raise RuntimeError(
                f"{len(owner)} of {len(actors)} client actors did not start within ray.actor_timeout_s = "
                f"{timeout_s:g} s (free now: {free})"
            )
        if time.monotonic() - reported >= every_s:
            reported = time.monotonic()
            unplaced = sum(
                raystate.placed(a) is False for a in owner.values()
            )  # the others are placed (starting or warming up) or unknown: a busy GCS is no news
            if unplaced:
                report(
                    f"waiting {waited:.0f} s for {unplaced} of {len(actors)} client actors to be placed (free now: "
                    f"{free}; timeout ray.actor_timeout_s = {timeout_s:g} s)"
                )

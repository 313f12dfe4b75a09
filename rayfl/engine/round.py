"""One round, written once: the in-process runner and the coordinator actor both drive rounds
through `dispatch`, `settle_round` and `evaluate` with their own executor.

A round: the policy selects among the available clients and configures tasks, in client-id
order. The executor runs them in fixed groups of `ray.clients_per_call` consecutive tasks (one
actor call each on Ray), each through `host.run_group`, which settles every client where it ran
and, for policies whose aggregate is a sum, returns one partial sum per group. Or, when the
policy opens a driver for the round, the executor opens one session per task and relays the
driver's calls. The engine adds the group sums in group order (every runner adds the same
numbers the same way, so 1 actor, N actors and the in-process runner agree bit for bit),
hands the policy's `aggregate` the reduced sum, and evaluates the global model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Collection, Protocol, Sequence

import numpy as np

from ..algorithms.aggregate import Sum, add_up
from ..algorithms.base import fine_tuned_head
from ..algorithms.capabilities import DrivesRounds, Personalizes, ReportsRounds
from ..algorithms.exchange import RoundDriver
from ..algorithms.messages import ClientFailure, ClientResult, ClientTask, ServerState
from ..devices import client_time, round_duration, spent
from ..types import ClientId, Round
from .admission import Batteries, admit
from .federation import Federation
from .host import GroupOutcome, Settled, settle_all

HoldSeconds = Callable[[GroupOutcome], float]
"""`clock: emulate`: the wall seconds a group's host must stay busy (its clients' scaled virtual
times, one after another)."""


class Executor(Protocol):
    """Runs a round's groups of tasks; hosts `host.run_group`."""

    def submit(
        self, groups: Sequence[Sequence[ClientTask]], *, sums: bool, hold_s: HoldSeconds | None = None
    ) -> Callable[[], list[GroupOutcome]]:
        """Start the groups; the returned call waits for them and gives their outcomes in group
        order. With `sums` (the scheduler's say), each group's accepted clients are added up where
        they ran (`host.run_group`). With `hold_s`, a group's host stays busy for `hold_s(outcome)`
        seconds from its start."""

    def exchange(self, tasks: Sequence[ClientTask], driver: RoundDriver) -> list[ClientResult | ClientFailure]:
        """A server-in-the-loop round: open a session per task, let `driver` drive them through a
        relay, close them and return their results."""


@dataclass(frozen=True)
class RoundUnderway:
    """A round whose tasks are out: what `settle_round` needs to finish it."""

    round: Round
    selected: Sequence[int]
    tasks: list[ClientTask]
    driver: RoundDriver | None
    collect: Callable[[], list[GroupOutcome]]
    held: list[Settled]
    """The selected clients settled when dispatched (`admission`: declined, dropped)."""

    def records(self, outcomes: Sequence[GroupOutcome]) -> list[Settled]:
        """Every selected client's record, given its groups' outcomes (`collect()`), in client-id order."""
        return sorted([r for g in outcomes for r in g.settled] + self.held, key=lambda r: r.outcome.client_id)


@dataclass(frozen=True)
class RoundOutcome:
    state: ServerState
    row: dict[str, Any]
    clients: list[dict[str, Any]]
    pending: Any = None
    """What a scheduler checkpoints with the state besides it (the clients still in flight), or None."""
    batteries: Batteries | None = None
    """The devices' charge when the round settled (checkpointed with it)."""


def groups_of(tasks: Sequence[ClientTask], size: int) -> list[list[ClientTask]]:
    """Consecutive groups of `size` tasks (the last may be smaller): the unit of an actor call
    and of the partial sums, the same whatever runs them."""
    return [list(tasks[i : i + size]) for i in range(0, len(tasks), size)]


def dispatch(
    fed: Federation,
    state: ServerState,
    rnd: Round,
    executor: Executor,
    start: float,
    batteries: Batteries,
    *,
    count: int,
    sums: bool,
    busy: Collection[ClientId] = (),
) -> RoundUnderway:
    """At virtual time `start`, select `count` (the scheduler's number; the policy may choose
    otherwise) among the clients online and not `busy` (still training an earlier task), configure
    the round's tasks, settle those their devices decline or cannot finish (`admission.admit`) and
    start the rest, added up where they run when the scheduler says `sums` (a server-in-the-loop
    round starts when gathered, since its driver runs here)."""
    policy, cfg = fed.policy, fed.config
    available = fed.population.available(rnd, start)
    if busy:
        available = np.setdiff1d(np.asarray(available), np.fromiter(busy, int))
    selected = policy.select(state, rnd, available, count)
    configured = sorted(policy.configure(state, rnd, selected), key=lambda t: t.client_id)
    tasks, held = admit(fed, configured, start, batteries)
    driver = policy.open_driver(state, rnd, tasks) if tasks and isinstance(policy, DrivesRounds) else None
    if driver is not None:

        def collect() -> list[GroupOutcome]:
            results = sorted(executor.exchange(tasks, driver), key=lambda o: o.client_id)
            return [settle_all(fed.account, zip(tasks, results), Sum() if sums else None)]

    else:
        hold_s = None
        if cfg.clock == "emulate":

            def hold_s(group: GroupOutcome) -> float:
                return cfg.clock_scale * sum(client_seconds(fed, rnd, s) for s in group.settled)

        collect = executor.submit(groups_of(tasks, cfg.call_size), sums=sums, hold_s=hold_s)
    return RoundUnderway(rnd, selected, configured, driver, collect, held)


def client_seconds(fed: Federation, rnd: Round, record: Settled) -> float:
    """A client's time on the virtual clock (0 for a skipped one; until it dropped for a dropped one)."""
    if record.cost is None:
        return 0.0
    if record.cut_s is not None:
        return record.cut_s
    return client_time(fed.population.state(record.outcome.client_id, rnd), *record.cost).total_s


def client_row(fed: Federation, task: ClientTask, record: Settled) -> dict[str, Any]:
    """A client's row of `clients.parquet`: its device this round, its task's columns, its
    outcome, what it spent on the virtual clock (`devices.spent`) and its result's own numbers."""
    out = record.outcome
    device = fed.population.state(out.client_id, task.round)
    row: dict[str, Any] = {
        "round": task.round,
        "client_id": out.client_id,
        "device": device.device,
        "device_flops": device.flops,
        "bandwidth_mbps": device.down_bps / 1e6,
        "upload_mbps": device.up_bps / 1e6,
        **task.columns(),
        "status": record.status,
        "reason": record.reason,
    }
    if isinstance(out, ClientResult):
        row.update(num_examples=out.num_examples, num_samples=out.num_samples)
    else:
        row.update(num_samples=out.num_samples)
    if record.cost is not None:
        row.update(spent(device, *record.cost, record.cut_s).columns())
    if isinstance(out, ClientResult):
        row.update(train_loss=out.train_loss, **out.metrics)
    return row


def settle_round(fed: Federation, state: ServerState, d: RoundUnderway, virtual_time_s: float) -> RoundOutcome:
    """Wait for the round's clients, record them, aggregate; the row's test metrics are left for
    `evaluate` (NaN). `virtual_time_s` is the clock before the round."""
    policy, cfg, rnd = fed.policy, fed.config, d.round
    started = time.perf_counter()  # a server-in-the-loop round's exchange runs from here
    outcomes = d.collect()
    by_client = {t.client_id: t for t in d.tasks}
    records = d.records(outcomes)
    accepted = [r.outcome for r in records if r.status == "ok"]
    rows = [client_row(fed, by_client[r.outcome.client_id], r) for r in records]
    timed = [r for r in rows if "total_s" in r]
    duration, waits = round_duration([r["total_s"] for r in timed])
    for r, w in zip(timed, waits):
        r["wait_s"] = w
    if d.driver is not None:
        if cfg.clock == "emulate":
            # Sessions meet at the server all through the round, so it is paced as a whole:
            # it lasts its scaled virtual duration (the slowest client's) in wall time too.
            time.sleep(max(0.0, cfg.clock_scale * duration - (time.perf_counter() - started)))
        if any(isinstance(r.outcome, ClientResult) for r in records):  # a broken exchange keeps the server's side
            state = d.driver.finish(state)
    state = policy.aggregate(state, rnd, accepted, add_up(g.total for g in outcomes))
    return RoundOutcome(
        state,
        round_row(
            fed, state, rnd, rows, accepted, len(d.selected), d.tasks, virtual_time_s + duration, duration, waits
        ),
        rows,
    )


def round_row(
    fed: Federation,
    state: ServerState,
    rnd: Round,
    rows: Sequence[dict[str, Any]],
    accepted: Sequence[ClientResult],
    num_selected: int,
    tasks: Sequence[ClientTask],
    virtual_time_s: float,
    duration: float,
    waits: Sequence[float],
) -> dict[str, Any]:
    """A round's row of `metrics.parquet` before evaluation: the clock at its end, its duration,
    bytes, client counts by status, mean waiting time and training loss, the round's rate and the
    policy's own columns (`round_metrics`); the test metrics NaN until `evaluate`."""
    return {
        "round": rnd,
        "virtual_time_s": virtual_time_s,
        "round_time_s": duration,
        "test_accuracy": math.nan,
        "test_loss": math.nan,
        "bytes_up": int(sum(r.get("bytes_up", 0) for r in rows)),
        "bytes_down": int(sum(r.get("bytes_down", 0) for r in rows)),
        "num_clients": len(accepted),
        "num_selected": num_selected,
        **{
            f"num_{status}": sum(r["status"] == status for r in rows)
            for status in ("failed", "rejected", "skipped", "dropped")
        },
        "energy_j": float(sum(r.get("energy_j", 0.0) for r in rows)),
        "population": fed.population.size(virtual_time_s),
        "mean_wait_s": float(np.mean(waits)) if len(waits) else 0.0,
        "train_loss": float(np.mean([r.train_loss for r in accepted])) if accepted else math.nan,
        "lr": fed.policy.lr(rnd),
        **(fed.policy.round_metrics(state, rnd, tasks) if isinstance(fed.policy, ReportsRounds) else {}),
    }


def evaluate(fed: Federation, outcome: RoundOutcome) -> RoundOutcome:
    """The round's test metrics, on evaluation rounds (`eval_every` and the last)."""
    rnd, cfg = outcome.row["round"], fed.config.federation
    if rnd % cfg.eval_every and rnd != cfg.rounds:
        return outcome
    row = {**outcome.row, **fed.policy.evaluate(outcome.state, rnd, fed.evaluator)}
    if cfg.personalize_epochs:
        personalize = (
            fed.policy.personalize if isinstance(fed.policy, Personalizes) else partial(fine_tuned_head, fed.policy)
        )
        row.update(personalize(outcome.state, rnd, fed.evaluator))
    return replace(outcome, row=row)


def run_round(
    fed: Federation,
    state: ServerState,
    rnd: Round,
    executor: Executor,
    virtual_time_s: float,
    batteries: Batteries | None = None,
) -> RoundOutcome:
    """One synchronous round, evaluated (summed where its clients run, as `Synchronous` does);
    `virtual_time_s` is the clock before it starts."""
    count, sums = fed.config.federation.clients_per_round, fed.account.sums
    dispatched = dispatch(fed, state, rnd, executor, virtual_time_s, batteries or Batteries(), count=count, sums=sums)
    return evaluate(fed, settle_round(fed, state, dispatched, virtual_time_s))

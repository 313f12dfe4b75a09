"""Deadline rounds with over-selection (`federation.mode: deadline`).

Bonawitz et al., "Towards Federated Learning at Scale: System Design", MLSys 2019, Sec. 2.2: the
server selects more devices than it needs (FedScale's and Oort's `overcommitment`) and closes the
round once enough have reported or a time limit passes. Here a round selects ceil(K (1 +
over_selection)) clients (`DeadlineConfig.selected`: the number this scheduler passes the policy),
all dispatched together against the current model at the round's start T, and on the virtual clock
they arrive at T + their time. The round closes at the K-th update in arrival order (ties by
client id) or at T + `deadline_s`, whichever comes first; without either it waits for every client
(a round that selected nobody lasts until the next late client arrives, or its deadline). Clients
after the close are late (status `late`, charged what they spent): their updates are dropped, or
with `late: carry` aggregated in the round they arrive in, moved onto the model of that round with
their staleness weight (`staleness.carried`). A late client is busy, never selected, until it
arrives.

Bonawitz et al. abandon a round when too few devices report in time; here that is
`federation.deadline.min_reports` M (0, the default: never). A round that selected clients and
closes with fewer than M updates on time makes no server step (the model stays; the round is
still recorded, evaluated and checkpointed, `abandoned` in its row); its on-time updates are
recorded with status `abandoned` (`num_abandoned`), charged what they cost, and discarded, as
are late updates carried into it (`num_discarded`). A round that selected nobody (every client
busy) only waits for the next late arrival: it is never abandoned.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Callable, Generator

from ..algorithms.messages import ClientResult, ClientTask, ServerState
from ..algorithms.staleness import carried
from .admission import Batteries
from .federation import Federation
from .flights import Flight, Pending, Rebase, flight_row, merge_arrivals, reconfigure, staleness_columns
from .host import GroupOutcome, Settled
from .round import Executor, RoundOutcome, RoundUnderway, client_seconds, dispatch, groups_of, round_row


class LateClients:
    """The late clients still out: flights, and for carried ones their outcome and task."""

    def __init__(self, fed: Federation, executor: Executor, pending: Pending | None):
        self.fed = fed
        self.flights: list[Flight] = list(pending.flights) if pending else []
        self.states: dict[int, ServerState] = dict(pending.states) if pending else {}
        self.outcomes: dict[int, tuple[Settled, ClientTask]] = {}
        self.collect: Callable[[], list[GroupOutcome]] | None = None
        self.tasks: list[ClientTask] = []
        carried = [f for f in self.flights if f.carry]
        if carried:  # a resumed run: train the carried clients again, as they trained before it stopped
            self.tasks = [reconfigure(fed, f, self.states) for f in carried]
            self.collect = executor.submit(groups_of(self.tasks, fed.config.call_size), sums=False)

    def busy(self) -> set[int]:
        return {f.client_id for f in self.flights}

    def add(self, flight: Flight, record: Settled, task: ClientTask, state: ServerState) -> None:
        self.flights.append(flight)
        if flight.carry:
            self.outcomes[flight.client_id] = (record, task)
            self.states[flight.version] = state

    def arrive(self, by: float) -> list[tuple[Flight, Settled, ClientTask]]:
        """The carried updates arriving by `by`, in arrival order; every flight arriving by
        then leaves (a dropped one's update is thrown away)."""
        if self.collect is not None:
            records = [r for g in self.collect() for r in g.settled]
            self.outcomes.update((t.client_id, (r, t)) for r, t in zip(records, self.tasks))
            self.collect = None
        arrived = sorted((f for f in self.flights if f.arrives_at <= by), key=lambda f: f.key)
        self.flights = [f for f in self.flights if f.arrives_at > by]
        return [(f, *self.outcomes.pop(f.client_id)) for f in arrived if f.carry]

    def pending(self) -> Pending:
        versions = {f.version for f in self.flights if f.carry}
        self.states = {v: s for v, s in self.states.items() if v in versions}
        return Pending(tuple(self.flights), dict(self.states))


class Deadline:
    """Rounds that close at the K-th update or the deadline. Round r + 1's tasks go out before
    round r is yielded, as in synchronous rounds."""

    def rounds(
        self,
        fed: Federation,
        executor: Executor,
        state: ServerState,
        virtual_time_s: float,
        pending: Pending | None,
        batteries: Batteries,
    ) -> Generator[RoundOutcome, None, None]:
        late = LateClients(fed, executor, pending)
        cfg = fed.config.federation
        last, count = cfg.rounds, cfg.deadline.selected(cfg.target_clients)  # over-selected
        if state.round >= last:
            return
        send = functools.partial(dispatch, fed, executor=executor, batteries=batteries, count=count, sums=False)
        d = send(state, state.round + 1, start=virtual_time_s, busy=late.busy())
        while True:
            out = replace(close(fed, d, state, virtual_time_s, late), batteries=batteries.snapshot())
            state, virtual_time_s = out.state, out.row["virtual_time_s"]
            following = send(state, d.round + 1, start=virtual_time_s, busy=late.busy()) if d.round < last else None
            yield out
            if following is None:
                return
            d = following


def close(fed: Federation, d: RoundUnderway, state: ServerState, start: float, late: LateClients) -> RoundOutcome:
    """Gather the round's clients, close it at the K-th update or the deadline, aggregate the
    updates on time and the carried ones arriving by then; record each client."""
    cfg, rnd = fed.config.federation, d.round
    records = d.records(d.collect())
    tasks = {t.client_id: t for t in d.tasks}
    slots = {t.client_id: k for k, t in enumerate(d.tasks)}
    arrivals = sorted(
        ((start + client_seconds(fed, rnd, r), r.outcome.client_id, r) for r in records), key=lambda x: x[:2]
    )
    on_time, missed, closed_at, updates = closing(fed, arrivals, start, late)
    flight = lambda a, c, carry=False: Flight(c, state.round, start, a, slots[c], carry)
    carried = late.arrive(closed_at)
    abandoned = bool(d.tasks) and updates < cfg.deadline.min_reports  # Bonawitz et al.: too few reported in time
    merged = (
        []
        if abandoned
        else sorted(
            [(flight(a, c), r, tasks[c], 0) for a, c, r in on_time if r.status == "ok"]
            + [(f, r, t, state.round - f.version) for f, r, t in carried],
            key=lambda x: x[0].key,
        )
    )
    new, accepted = merge_arrivals(
        fed, state, rnd, [(r.outcome, t, s) for _, r, t, s in merged], carry_onto(fed, state)
    )
    rows = [flight_row(fed, tasks[c], r, flight(a, c), rnd, 0) for a, c, r in on_time]
    for row, (a, _, _) in zip(rows, on_time):
        if "total_s" in row:  # a skipped client cost nothing and waited for nothing
            row["wait_s"] = closed_at - a
        if abandoned and row["status"] == "ok":
            row.update(
                status="abandoned",
                reason=f"the round closed at {closed_at:.3f} s with {updates} update(s) on time, fewer than "
                f"federation.deadline.min_reports = {cfg.deadline.min_reports}",
            )
    for a, c, r in missed:
        keep = cfg.deadline.late == "carry" and r.status == "ok"
        late.add(flight(a, c, keep), r, tasks[c], state)
        row = flight_row(fed, tasks[c], r, flight(a, c), rnd, float("nan"))
        if r.status == "ok":
            row.update(
                status="late",
                reason=f"arrived at {a:.3f} s, after the round closed at {closed_at:.3f} s "
                f"({'carried' if keep else 'dropped'})",
            )
        rows.append(row)
    waits = [row["wait_s"] for row in rows if "wait_s" in row]
    extra: dict[str, Any] = {
        "model_version": rnd,
        "num_carried": 0 if abandoned else len(carried),
        "abandoned": abandoned,
        "num_abandoned": sum(r["status"] == "abandoned" for r in rows),
        "num_discarded": len(carried) if abandoned else 0,
        **staleness_columns([s for *_, s in merged], sum(r["status"] == "late" for r in rows)),
    }
    row = round_row(fed, new, rnd, rows, accepted, len(d.selected), d.tasks, closed_at, closed_at - start, waits)
    return RoundOutcome(new, {**row, **extra}, rows, late.pending())


Arrival = tuple[float, int, Settled]
"""A client's arrival: its virtual time, its id, its record."""


def closing(
    fed: Federation, arrivals: list[Arrival], start: float, late: LateClients
) -> tuple[list[Arrival], list[Arrival], float, int]:
    """Bonawitz et al.'s closing rule over a round's `arrivals` (in arrival order): the round
    closes at its K-th update (failed, rejected and skipped clients do not count) or at its
    deadline, whichever comes first; with neither, at its last arrival. Returns the arrivals on
    time, those after the close, the close and the updates on time."""
    cfg = fed.config.federation
    limit = start + cfg.deadline.deadline_s if cfg.deadline.deadline_s is not None else float("inf")
    on_time, missed, closed_at, updates = [], [], None, 0
    for a, c, r in arrivals:
        if closed_at is not None or a > limit:
            missed.append((a, c, r))
            continue
        on_time.append((a, c, r))
        updates += r.status == "ok"
        if updates == cfg.target_clients:
            closed_at = a
    if closed_at is None and (missed or on_time):
        closed_at = limit if missed else max(a for a, _, _ in on_time)
    elif closed_at is None:  # nobody to select (all busy, say): the round lasts until the next arrival or the deadline
        closed_at = (
            min([limit, *(f.arrives_at for f in late.flights)]) if late.flights or limit < float("inf") else start
        )
    return on_time, missed, closed_at, updates


def carry_onto(fed: Federation, state: ServerState) -> Rebase:
    """A deadline round's rule for its updates: one on time is taken as it is; a carried one is
    moved onto `state`'s model, keeping its weight among them (`staleness.carried`)."""
    cfg, params = fed.config.federation.staleness, fed.context.param_names

    def move(result: ClientResult, task: ClientTask, staleness: int) -> ClientResult:
        return result if staleness == 0 else carried(result, task.weights, state.weights, staleness, cfg, params)

    return move

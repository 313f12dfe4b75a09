"""What a device does with a task it is sent, decided on the virtual clock before it trains
(docs/devices.md); every scheduler calls `admit` when it dispatches.

- A device with a limited battery declines a task whose planned energy exceeds what it has
  left (status `skipped`, reason `battery`, no cost). It accepts otherwise and commits the
  task's energy (what it spends up to a dropout, if it drops). A device that has been offline
  since its last task comes back recharged in full.
- A device whose online stretch ends (or which leaves the population) before its task's
  planned end drops at that moment (status `dropped`): it is charged the time, FLOPs, bytes
  and energy it spent until then (`devices.spent`), sends no update, and never trains (its
  outcome is known before it would).

The planned time and energy are those of the task succeeding (`plan`), what the server can
know when it dispatches; every decision is a pure function of the population and the clock
but for the batteries, which are checkpointed (`Batteries`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ..algorithms.local import epoch_samples
from ..algorithms.messages import ClientFailure, ClientResult, ClientTask
from ..devices import DeviceState, client_time, energy_j, spent
from ..statetypes import state_type
from .federation import Federation
from .host import Settled


@dataclass(frozen=True)
class Plan:
    """A task as the server can know it when it dispatches: the client's device in the task's
    round, and the task's (FLOPs, bytes down, bytes up) when it succeeds (the local epochs over
    the client's samples, `epoch_samples`)."""

    device: DeviceState
    cost: tuple[float, int, int]

    @property
    def seconds(self) -> float:
        return client_time(self.device, *self.cost).total_s


def plan(fed: Federation, task: ClientTask) -> Plan:
    n = int(fed.context.num_examples[task.client_id])
    done = ClientResult.of(
        task,
        weights=task.weights,
        num_examples=n,
        num_samples=task.local_epochs * epoch_samples(n, task.batch_size),
        train_loss=math.nan,
    )
    return Plan(fed.population.state(task.client_id, task.round), fed.account.cost(task, done))


def planned_seconds(fed: Federation, task: ClientTask) -> float:
    """A task's time on the virtual clock when it succeeds: download, train, upload."""
    return plan(fed, task).seconds


@state_type
@dataclass
class Batteries:
    """Charge left (J) and the start of the online stretch it was measured in, per client that
    has spent energy since its last charge; the others are full."""

    levels: dict[int, tuple[float, float]] = field(default_factory=dict)

    def snapshot(self) -> "Batteries":
        return Batteries(dict(self.levels))


def dropped(fed: Federation, task: ClientTask, start: float, planned: Plan | None = None) -> Settled | None:
    """The record of a task that its device cannot finish online, dispatched at `start`
    (None when it can)."""
    planned = planned or plan(fed, task)
    total = planned.seconds
    end = fed.population.until(task.client_id, task.round, start, start + total)
    if end >= start + total:
        return None
    reason = f"went offline at {end:.3f} s, {end - start:.3f} s into a {total:.3f} s task"
    return Settled(ClientFailure.of(task, reason), "dropped", reason, planned.cost, cut_s=end - start)


def admit(
    fed: Federation, tasks: Sequence[ClientTask], start: float, batteries: Batteries
) -> tuple[list[ClientTask], list[Settled]]:
    """The tasks that go out to train, and the records of those settled here: declined for the
    battery, or dropped. Commits the energy of each accepted task to its battery."""
    run, held = [], []
    for task in tasks:
        planned = plan(fed, task)
        record = dropped(fed, task, start, planned)
        c, device = task.client_id, planned.device
        if device.battery_j < math.inf:
            since = fed.population.since(c, task.round, start)
            left, seen = batteries.levels.get(c, (device.battery_j, since))
            left = device.battery_j if seen != since else left
            need = energy_j(device, planned.cost[0], planned.cost[1] + planned.cost[2])
            if need > left:
                reason = f"battery: the task needs {need:.1f} J, {left:.1f} J left"
                held.append(Settled(ClientFailure.of(task, reason, skipped=True), "skipped", reason, None))
                continue
            batteries.levels[c] = (
                left - spent(device, *planned.cost, record.cut_s if record else None).energy_j,
                since,
            )
        if record is not None:
            held.append(record)
        else:
            run.append(task)
    return run, held

"""The round loop, written once (STYLE.md 2): the in-process runner and the coordinator actor
both drive rounds through `dispatch`, `settle` and `evaluate` with their own executor.

A round: the policy selects among the available clients and configures tasks, in client-id
order. The executor runs them in fixed groups of `ray.clients_per_call` consecutive tasks (one
actor call each on Ray), each group through `run_group`: every client's outcome is settled
where it ran (`settle`: status, reason, cost on the virtual clock) and, for policies whose
aggregate is a sum, added into the group's partial sum, so a group returns one partial
aggregate instead of one model per client. Or, when the policy opens a driver for the round,
the executor opens one session per task and relays the driver's calls. The engine adds the
group sums in group order (every runner adds the same numbers the same way, so 1 actor, N
actors and the in-process runner agree bit for bit), aggregates, and evaluates the global
model, which `run_federation` overlaps with the next round's training.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from . import rng
from .algorithms import registry
from .algorithms.aggregate import accumulate, add_up, invalid_reason
from .algorithms.base import ClientFailure, ClientProcedure, ClientResult, ClientTask, FederationContext, ServerPolicy, ServerState
from .algorithms.exchange import RoundDriver
from .config import ConfigError, ModelConfig, RunConfig
from .data import Clients, load_clients
from .devices import CostCache, DeviceState, ModelCost, Population, client_time, configured_profile, round_duration
from .evaluate import Evaluator
from .models import ModelCache, to_numpy
from .optim import OptimizerSpec
from .types import Round
from .algorithms.vectorize import check_vectorizable


@dataclass(frozen=True)
class Settled:
    """One client's outcome as the round records it."""

    outcome: ClientResult | ClientFailure
    """The result (its weights dropped once added into a partial sum) or the failure."""
    status: str
    """ok | rejected (an update with non-finite values, wrong keys or shapes) | failed | skipped."""
    reason: str
    cost: tuple[float, int, int] | None
    """(training FLOPs, bytes down, bytes up) on the virtual clock; None for a skipped client."""


@dataclass(frozen=True)
class GroupOutcome:
    """A group of clients run together: each one's record, and the partial sum of the accepted
    clients' summands (policies whose aggregate is a sum; None otherwise or when none was accepted)."""

    settled: list[Settled]
    total: dict[str, np.ndarray] | None


Pace = Callable[[GroupOutcome], float]
"""`clock: emulate`: the wall seconds a group's host must stay busy (its clients' scaled virtual
times, one after another)."""


class Executor(Protocol):
    """Runs a round's groups of tasks; hosts `run_group`."""

    def submit(self, groups: Sequence[Sequence[ClientTask]], pace: Pace | None = None) -> Callable[[], list[GroupOutcome]]:
        """Start the groups; the returned call waits for them and gives their outcomes in group
        order. With `pace`, a group's host stays busy for `pace(outcome)` seconds from its start."""

    def exchange(self, tasks: Sequence[ClientTask], driver: RoundDriver) -> list[ClientResult | ClientFailure]:
        """A server-in-the-loop round: open a session per task, let `driver` drive them through a
        relay, close them and return their results."""


def settle(policy: ServerPolicy, task: ClientTask, out: ClientResult | ClientFailure) -> Settled:
    """The one client-outcome logic: a skipped client costs nothing; a failed one its download and
    the samples it processed; an update is checked against its task (`invalid_reason`) and costed
    by the policy's `client_cost`."""
    if isinstance(out, ClientFailure):
        if out.skipped:
            return Settled(out, "skipped", out.reason, None)
        spent = ClientResult(out.client_id, out.round, {}, 0, out.num_samples, math.nan)
        return Settled(out, "failed", out.reason, policy.client_cost(task, spent))
    reason = invalid_reason(out.weights, task.weights)
    return Settled(out, "rejected" if reason else "ok", reason or "", policy.client_cost(task, out))


def run_group(runner: Any, policy: ServerPolicy, tasks: Sequence[ClientTask]) -> GroupOutcome:
    """Run a group's tasks one after another (or vectorized, by the runner) and settle each; for a
    policy whose aggregate is a sum, add the accepted clients' summands in task order and drop
    their weights. Both executors call this, in process and on each actor."""
    settled, total = [], None
    for task, out in zip(tasks, runner.run_all(tasks)):
        record = settle(policy, task, out)
        if policy.sums and record.status == "ok":
            total = accumulate(total, policy.summand(out))  # added as it comes: no summand is held
            record = replace(record, outcome=replace(out, weights={}))
        settled.append(record)
    return GroupOutcome(settled, total)


@dataclass(frozen=True, eq=False)
class Federation:
    """The static parts of a run, built once from its config (then shipped to where it runs)."""

    config: RunConfig
    clients: Clients
    population: Population
    context: FederationContext
    policy: ServerPolicy
    procedure: ClientProcedure
    models: ModelCache
    costs: CostCache
    evaluator: Evaluator

    def initial_weights(self) -> dict[str, np.ndarray]:
        """The global model's initial weights, seeded by (seed, "init"), with the tensors of
        `model.init_weights` whose names and shapes match (FeDepth's depth-wise fine-tuning)."""
        with rng.seeded_torch(self.config.seed, "init"):
            weights = to_numpy(self.models.build(self.policy.global_model()))
        if self.config.model.init_weights is not None:
            import torch  # the driver only; a pretrained state is read once

            saved = torch.load(Path(self.config.model.init_weights).expanduser(), map_location="cpu", weights_only=True)
            matched = {k: v.numpy() for k, v in saved.items() if k in weights and tuple(v.shape) == weights[k].shape}
            if not matched:
                raise ConfigError(f"model.init_weights: no tensor of {self.config.model.init_weights} matches model {self.config.model.name}")
            weights.update((k, v.astype(weights[k].dtype)) for k, v in matched.items())
        return weights

    def cost_of(self, variant: ModelConfig) -> ModelCost:
        return self.context.cost_of(variant)


def build_federation(config: RunConfig) -> Federation:
    """Load the data as logical clients, deal devices, build the policy: everything but the
    executor. Nothing here loops over the clients: a population of millions costs a few arrays."""
    clients = load_clients(config.data, config.seed)
    population = Population(configured_profile(config.devices), config.data.num_clients, config.seed)
    models = ModelCache(clients.input_shape, clients.num_classes)
    probe = models.build(config.model)
    costs = CostCache()
    cost_of = lambda variant: costs.get(variant, lambda: models.build(variant), clients.input_shape)  # noqa: E731
    context = FederationContext(
        seed=config.seed,
        num_clients=config.data.num_clients,
        num_classes=clients.num_classes,
        input_shape=clients.input_shape,
        num_examples=clients.sizes(),
        label_histogram=clients.label_histogram,
        param_names=frozenset(name for name, _ in probe.named_parameters()),
        memory_bytes=population.memory_bytes(lambda rate: width_memory(config, cost_of, rate)),
        test_split=clients.test_split,
        cost_of=cost_of,
        device_state=population.state,
        device_classes=population.class_of,
    )
    algorithm = registry.get(config.algorithm.name)
    if config.ray.vectorize > 1:
        if not algorithm.procedure.vectorizable:
            raise ConfigError(f"ray.vectorize: {config.algorithm.name} trains its clients one at a time; use ray.vectorize: 1")
        check_vectorizable(probe, f"model {config.model.name}")
    policy = algorithm.policy(config, context)
    evaluator = Evaluator(clients, models, config.federation.eval_batch_size, config.federation.eval_clients)
    return Federation(config, clients, population, context, policy, algorithm.procedure(config), models, costs, evaluator)


def width_memory(config: RunConfig, cost_of: Callable[[ModelConfig], ModelCost], rate: float) -> int:
    """A `memory_width` budget: the training memory of the run's model at width `rate` (its batch
    size and optimizer), measured (`ModelCost.training_memory`). The width is set without
    validation, so rates above 1 measure a wider network than any config allows."""
    if not hasattr(config.model, "rate"):
        raise ConfigError(f"devices.profile: memory_width budgets need a width-scalable model, not {config.model.name}")
    slots = OptimizerSpec.of(config.federation, config.federation.lr).state_slots
    return cost_of(config.model.model_copy(update={"rate": rate})).training_memory(config.federation.batch_size, slots)


def cost_row(device: DeviceState, flops: float, bytes_down: int, bytes_up: int) -> dict[str, Any]:
    """A client's columns of the virtual clock: FLOPs, compute and communication seconds, bytes."""
    t = client_time(device, flops, bytes_down, bytes_up)
    return {"flops": flops, "compute_s": t.compute_s, "comm_s": t.comm_s, "total_s": t.total_s, "bytes_down": bytes_down, "bytes_up": bytes_up}


@dataclass(frozen=True)
class Dispatched:
    """A round whose tasks are out: what `settle_round` needs to finish it."""

    round: Round
    selected: Sequence[int]
    tasks: list[ClientTask]
    driver: RoundDriver | None
    gather: Callable[[], list[GroupOutcome]]


def groups_of(tasks: Sequence[ClientTask], size: int) -> list[list[ClientTask]]:
    """Consecutive groups of `size` tasks (the last may be smaller): the unit of an actor call
    and of the partial sums, the same whatever runs them."""
    return [list(tasks[i : i + size]) for i in range(0, len(tasks), size)]


def dispatch(fed: Federation, state: ServerState, rnd: Round, executor: Executor) -> Dispatched:
    """Select, configure and start the round's tasks (a server-in-the-loop round starts when
    gathered, since its driver runs here)."""
    policy, cfg = fed.policy, fed.config
    selected = policy.select(state, rnd, fed.population.available(rnd))
    tasks = sorted(policy.configure(state, rnd, selected), key=lambda t: t.client_id)
    driver = policy.open_driver(state, rnd, tasks)
    if driver is not None:
        gather = lambda: [GroupOutcome([settle(policy, t, o) for t, o in zip(tasks, sorted(executor.exchange(tasks, driver), key=lambda o: o.client_id))], None)]  # noqa: E731
    else:
        pace = None
        if cfg.clock == "emulate":
            pace = lambda group: cfg.clock_scale * sum(client_seconds(fed, rnd, s) for s in group.settled)  # noqa: E731
        gather = executor.submit(groups_of(tasks, cfg.ray.clients_per_call), pace)
    return Dispatched(rnd, selected, tasks, driver, gather)


def client_seconds(fed: Federation, rnd: Round, record: Settled) -> float:
    """A client's time on the virtual clock (0 for a skipped one)."""
    if record.cost is None:
        return 0.0
    return client_time(fed.population.state(record.outcome.client_id, rnd), *record.cost).total_s


@dataclass(frozen=True)
class RoundOutcome:
    state: ServerState
    row: dict[str, Any]
    clients: list[dict[str, Any]]


def settle_round(fed: Federation, state: ServerState, d: Dispatched, virtual_time_s: float) -> RoundOutcome:
    """Wait for the round's clients, record them, aggregate; the row's test metrics are left for
    `evaluate` (NaN). `virtual_time_s` is the clock before the round."""
    policy, cfg, rnd = fed.policy, fed.config, d.round
    started = time.perf_counter()  # a server-in-the-loop round's exchange runs from here
    outcomes = d.gather()
    by_client = {t.client_id: t for t in d.tasks}
    records = [r for group in outcomes for r in group.settled]
    total = add_up(g.total for g in outcomes if g.total is not None)
    accepted = [r.outcome for r in records if r.status == "ok"]
    rows: list[dict[str, Any]] = []
    for record in records:
        out, task = record.outcome, by_client[record.outcome.client_id]
        device = fed.population.state(out.client_id, rnd)
        row: dict[str, Any] = {
            "round": rnd,
            "client_id": out.client_id,
            "device": device.device,
            "device_flops": device.flops,
            "bandwidth_mbps": device.bandwidth_bps / 1e6,
            "batch_size": task.batch_size,
            "lr": task.optimizer.lr,
            "model_rate": getattr(task.model, "rate", math.nan),
            "status": record.status,
            "reason": record.reason,
        }
        if isinstance(out, ClientResult):
            row.update(num_examples=out.num_examples, num_samples=out.num_samples)
        else:
            row.update(num_samples=out.num_samples)
        if record.cost is not None:
            row.update(cost_row(device, *record.cost))
        if isinstance(out, ClientResult):
            row.update(train_loss=out.train_loss, **out.metrics)
        rows.append(row)

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

    state = policy.aggregate(state, rnd, accepted, total)
    row = {
        "round": rnd,
        "virtual_time_s": virtual_time_s + duration,
        "round_time_s": duration,
        "test_accuracy": math.nan,
        "test_loss": math.nan,
        "bytes_up": int(sum(r.get("bytes_up", 0) for r in rows)),
        "bytes_down": int(sum(r.get("bytes_down", 0) for r in rows)),
        "num_clients": len(accepted),
        "num_selected": len(d.selected),
        "num_failed": sum(r["status"] == "failed" for r in rows),
        "num_rejected": sum(r["status"] == "rejected" for r in rows),
        "num_skipped": sum(r["status"] == "skipped" for r in rows),
        "mean_wait_s": float(np.mean(waits)) if waits else 0.0,
        "train_loss": float(np.mean([r.train_loss for r in accepted])) if accepted else math.nan,
        "lr": policy.lr(rnd),
        **policy.round_metrics(state, rnd, d.tasks),
    }
    return RoundOutcome(state, row, rows)


def evaluate(fed: Federation, outcome: RoundOutcome) -> RoundOutcome:
    """The round's test metrics, on evaluation rounds (`eval_every` and the last)."""
    rnd, cfg = outcome.row["round"], fed.config.federation
    if rnd % cfg.eval_every and rnd != cfg.rounds:
        return outcome
    row = {**outcome.row, **fed.policy.evaluate(outcome.state, rnd, fed.evaluator)}
    if cfg.personalize_epochs:
        row.update(fed.policy.personalize(outcome.state, rnd, fed.evaluator))
    return replace(outcome, row=row)


def run_round(fed: Federation, state: ServerState, rnd: Round, executor: Executor, virtual_time_s: float) -> RoundOutcome:
    """One synchronous round, evaluated; `virtual_time_s` is the clock before it starts."""
    return evaluate(fed, settle_round(fed, state, dispatch(fed, state, rnd, executor), virtual_time_s))

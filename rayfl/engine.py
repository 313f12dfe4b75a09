"""The round loop, written once (STYLE.md 2): the in-process runner and the coordinator actor
both call `run_round` with their own executor.

A round: the policy selects among the available clients and configures tasks; the executor
runs them (in any order, anywhere), or, when the policy opens a driver for the round, opens one
session per task and relays the driver's calls to them; results are sorted by client id,
validated against the task they answer, costed on the virtual clock and aggregated by the
policy; the global model is evaluated; one round row and one row per client are returned.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from . import rng
from .algorithms import registry
from .algorithms.aggregate import invalid_reason
from .algorithms.base import ClientFailure, ClientProcedure, ClientResult, ClientTask, FederationContext, ServerPolicy, ServerState
from .algorithms.exchange import RoundDriver
from .config import ModelConfig, RunConfig
from .data import Dataset, Partition, load_dataset, partition
from .devices import CostCache, DeviceState, ModelCost, Population, client_time, configured_profile, round_duration
from .evaluate import Evaluator
from .models import ModelCache, to_numpy
from .types import Round

Pace = Callable[[ClientTask, ClientResult], float]
"""`clock: emulate`: the wall seconds a client's task must take (its scaled virtual time)."""


class Executor(Protocol):
    """Runs a round's client tasks and returns one outcome per task, in any order."""

    def run(self, tasks: Sequence[ClientTask], pace: Pace | None = None) -> list[ClientResult | ClientFailure]:
        """Each task on its own; with `pace`, the host that ran a task stays busy until the task
        has taken `pace(task, result)` wall seconds."""

    def exchange(self, tasks: Sequence[ClientTask], driver: RoundDriver) -> list[ClientResult | ClientFailure]:
        """A server-in-the-loop round: open a session per task, let `driver` drive them through a
        relay, close them and return their results."""


@dataclass(frozen=True, eq=False)
class Federation:
    """The static parts of a run, built once from its config (then shipped to where it runs)."""

    config: RunConfig
    dataset: Dataset
    partition: Partition
    population: Population
    context: FederationContext
    policy: ServerPolicy
    procedure: ClientProcedure
    models: ModelCache
    costs: CostCache
    evaluator: Evaluator

    def initial_weights(self) -> dict[str, np.ndarray]:
        """The global model's initial weights, seeded by (seed, "init")."""
        with rng.seeded_torch(self.config.seed, "init"):
            return to_numpy(self.models.build(self.policy.global_model()))

    def cost_of(self, variant: ModelConfig) -> ModelCost:
        return self.context.cost_of(variant)


def build_federation(config: RunConfig, dataset: Dataset | None = None) -> Federation:
    """Load data, partition it, deal devices, build the policy: everything but the executor."""
    dataset = dataset if dataset is not None else load_dataset(config.data, config.seed)
    parts = partition(dataset, config.data, config.seed)
    population = Population(configured_profile(config.devices), config.data.num_clients, config.seed)
    models = ModelCache(dataset.input_shape, dataset.num_classes)
    probe = models.build(config.model)
    costs = CostCache()
    context = FederationContext(
        seed=config.seed,
        num_clients=config.data.num_clients,
        num_classes=dataset.num_classes,
        input_shape=dataset.input_shape,
        num_examples=parts.sizes(),
        label_histogram=parts.label_histogram(),
        param_names=frozenset(name for name, _ in probe.named_parameters()),
        memory_bytes=np.array([population.device_class(k).memory_mb * 2**20 for k in range(config.data.num_clients)]),
        test_split=parts.test,
        cost_of=lambda variant: costs.get(variant, lambda: models.build(variant), dataset.input_shape),
        device_state=population.state,
    )
    algorithm = registry.get(config.algorithm.name)
    policy = algorithm.policy(config, context)
    evaluator = Evaluator(dataset, parts.train, models, config.federation.eval_batch_size)
    return Federation(config, dataset, parts, population, context, policy, algorithm.procedure(config), models, costs, evaluator)


def cost_row(device: DeviceState, flops: float, bytes_down: int, bytes_up: int) -> dict[str, Any]:
    """A client's columns of the virtual clock: FLOPs, compute and communication seconds, bytes."""
    t = client_time(device, flops, bytes_down, bytes_up)
    return {"flops": flops, "compute_s": t.compute_s, "comm_s": t.comm_s, "total_s": t.total_s, "bytes_down": bytes_down, "bytes_up": bytes_up}


@dataclass(frozen=True)
class RoundOutcome:
    state: ServerState
    row: dict[str, Any]
    clients: list[dict[str, Any]]


def run_round(fed: Federation, state: ServerState, rnd: Round, executor: Executor, virtual_time_s: float) -> RoundOutcome:
    """One synchronous round; `virtual_time_s` is the clock before it starts."""
    policy, cfg = fed.policy, fed.config
    selected = policy.select(state, rnd, fed.population.available(rnd))
    tasks = sorted(policy.configure(state, rnd, selected), key=lambda t: t.client_id)
    by_client = {t.client_id: t for t in tasks}
    emulate = cfg.clock == "emulate"

    def seconds(task: ClientTask, result: ClientResult) -> float:
        return client_time(fed.population.state(task.client_id, rnd), *policy.client_cost(task, result)).total_s

    driver = policy.open_driver(state, rnd, tasks)
    started = time.perf_counter()
    if driver is None:
        outcomes = executor.run(tasks, (lambda t, r: cfg.clock_scale * seconds(t, r)) if emulate else None)
    else:
        outcomes = executor.exchange(tasks, driver)
    outcomes = sorted(outcomes, key=lambda r: r.client_id)

    accepted: list[ClientResult] = []
    rows: list[dict[str, Any]] = []
    for out in outcomes:
        task = by_client[out.client_id]
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
        }
        rows.append(row)
        if isinstance(out, ClientFailure):
            row.update(status="skipped" if out.skipped else "failed", reason=out.reason, num_samples=out.num_samples)
            if not out.skipped:  # it downloaded the model and trained until it failed: that time was spent
                row.update(cost_row(device, *policy.client_cost(task, ClientResult(out.client_id, rnd, {}, 0, out.num_samples, math.nan))))
            continue
        reason = invalid_reason(out.weights, task.weights)
        row.update(
            status="rejected" if reason else "ok",
            reason=reason or "",
            num_examples=out.num_examples,
            num_samples=out.num_samples,
            **cost_row(device, *policy.client_cost(task, out)),
            train_loss=out.train_loss,
            **out.metrics,
        )
        if not reason:
            accepted.append(out)

    timed = [r for r in rows if "total_s" in r]
    duration, waits = round_duration([r["total_s"] for r in timed])
    for r, w in zip(timed, waits):
        r["wait_s"] = w
    if driver is not None:
        if emulate:
            # Sessions meet at the server all through the round, so it is paced as a whole:
            # it lasts its scaled virtual duration (the slowest client's) in wall time too.
            time.sleep(max(0.0, cfg.clock_scale * duration - (time.perf_counter() - started)))
        if any(isinstance(out, ClientResult) for out in outcomes):  # a failed exchange keeps the server's side
            state = driver.finish(state)

    state = policy.aggregate(state, rnd, accepted)
    evaluate = rnd % cfg.federation.eval_every == 0 or rnd == cfg.federation.rounds
    metrics = policy.evaluate(state, rnd, fed.evaluator) if evaluate else {"test_accuracy": math.nan, "test_loss": math.nan}
    row = {
        "round": rnd,
        "virtual_time_s": virtual_time_s + duration,
        "round_time_s": duration,
        "test_accuracy": metrics.pop("test_accuracy"),
        "test_loss": metrics.pop("test_loss"),
        "bytes_up": int(sum(r.get("bytes_up", 0) for r in rows)),
        "bytes_down": int(sum(r.get("bytes_down", 0) for r in rows)),
        "num_clients": len(accepted),
        "num_selected": len(selected),
        "num_failed": sum(r["status"] in ("failed", "rejected") for r in rows),
        "num_skipped": sum(r["status"] == "skipped" for r in rows),
        "mean_wait_s": float(np.mean(waits)) if waits else 0.0,
        "train_loss": float(np.mean([r.train_loss for r in accepted])) if accepted else math.nan,
        "lr": policy.lr(rnd),
        **policy.round_metrics(state, rnd, tasks),
        **metrics,
    }
    return RoundOutcome(state, row, rows)

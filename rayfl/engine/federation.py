"""A federation: the static parts of a run, built once from its config and shipped to where it runs.

Everything is resolved here once and carried: the algorithm (its record, which the parsed config carries),
the device population and its profile (with `devices.mix`), the model variants' measured costs
and training memory (`FederationContext`), the policy, the procedure and the evaluator.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import rng
from ..algorithms.base import ClientProcedure, ServerPolicy
from ..algorithms.capabilities import ClientAccount
from ..algorithms.messages import FederationContext
from ..algorithms.registry import Algorithm
from ..algorithms.vectorize import check_vectorizable
from ..config import ConfigError, ModelConfig, RunConfig, shown
from ..data import Clients, load_clients
from ..devices import CostCache, ModelCost, Population
from ..evaluate import Evaluator
from ..models import ModelCache, to_numpy
from ..optim import OptimizerSpec


@dataclass(frozen=True, eq=False)
class Federation:
    """The static parts of a run, built once from its config (then shipped to where it runs)."""

    config: RunConfig
    algorithm: Algorithm
    """The algorithm's record, resolved when the config was parsed (`config.algorithm.record`)."""
    clients: Clients
    population: Population
    context: FederationContext
    policy: ServerPolicy
    account: ClientAccount
    """What each client's host computes for the server (its cost, its summand): `capabilities.ClientAccount`."""
    procedure: ClientProcedure
    models: ModelCache
    costs: CostCache
    evaluator: Evaluator
    vectorizable: bool = False
    """Whether the algorithm and model can train clients K at a time (`ray.vectorize`)."""

    def initial_weights(self) -> dict[str, np.ndarray]:
        """The global model's initial weights, seeded by (seed, "init"), with the tensors of
        `model.init_weights` whose names and shapes match (FeDepth's depth-wise fine-tuning)."""
        with rng.seeded_torch(self.config.seed, "init"):
            weights = to_numpy(self.models.build(self.policy.global_model()))
        if self.config.model.init_weights is not None:
            import torch  # the driver only; a pretrained state is read once

            path = Path(self.config.model.init_weights).expanduser()
            try:
                with warnings.catch_warnings():  # torch's note on pickle protocols: the line below says it all
                    warnings.simplefilter("ignore")
                    saved = torch.load(path, map_location="cpu", weights_only=True)
            except Exception:  # noqa: BLE001 - pickled code, a truncated or foreign file: unpickler, zip or OS errors
                saved = None
            if not (isinstance(saved, dict) and all(isinstance(v, torch.Tensor) for v in saved.values())):
                raise ConfigError(
                    f"model.init_weights: {shown(str(path), 120)} is not a file of named tensors (torch.save of a "
                    "model's state_dict); rayfl never runs code from a weights file"
                )
            matched = {k: v.numpy() for k, v in saved.items() if k in weights and tuple(v.shape) == weights[k].shape}
            if not matched:
                raise ConfigError(
                    f"model.init_weights: no tensor of {self.config.model.init_weights} matches model "
                    f"{self.config.model.name}"
                )
            weights.update((k, v.astype(weights[k].dtype)) for k, v in matched.items())
        return weights

    def cost_of(self, variant: ModelConfig) -> ModelCost:
        return self.context.cost_of(variant)


def build_federation(config: RunConfig) -> Federation:
    """Load the data as logical clients, deal devices, build the policy: everything but the
    executor. Nothing here loops over the clients: a population of millions costs a few arrays."""
    algorithm = config.algorithm.record
    if algorithm is None or algorithm.name != config.algorithm.name:  # a config built by hand, or changed since
        raise ConfigError("algorithm: a config not parsed by rayfl.load.parse_config names no algorithm")
    clients = load_clients(config.data, config.seed)
    population = Population.of(config.devices, config.data.num_clients, config.seed)
    models = ModelCache(clients.input_shape, clients.num_classes)
    probe = models.build(config.model)
    costs = CostCache()
    cost_of = lambda variant: costs.get(variant, lambda: models.build(variant), clients.input_shape)
    slots = OptimizerSpec.of(config.federation, config.federation.lr).state_slots
    training_memory = lambda variant: cost_of(variant).training_memory(config.federation.batch_size, slots)
    context = FederationContext(
        seed=config.seed,
        num_clients=config.data.num_clients,
        num_classes=clients.num_classes,
        input_shape=clients.input_shape,
        num_examples=clients.sizes(),
        label_histogram=clients.label_histogram,
        param_names=frozenset(name for name, _ in probe.named_parameters()),
        memory_bytes=population.memory_bytes(lambda rate: width_memory(config, training_memory, rate)),
        test_split=clients.test_split,
        cost_of=cost_of,
        device_state=population.state,
        device_classes=population.class_of,
        profile=population.profile,
        training_memory=training_memory,
    )
    vectorizable = vectorizes(config, algorithm, probe)
    if vectorizable:
        check_width(config, training_memory(config.model))
    policy = algorithm.policy(config, context)
    evaluator = Evaluator(clients, models, config.federation.eval_batch_size, config.federation.eval_clients)
    return Federation(
        config,
        algorithm,
        clients,
        population,
        context,
        policy,
        ClientAccount.of(policy),
        algorithm.procedure(config),
        models,
        costs,
        evaluator,
        vectorizable,
    )


def vectorizes(config: RunConfig, algorithm: Any, probe: Any) -> bool:
    """Whether the algorithm's clients and the model can train K at a time; `ConfigError` where
    `ray.vectorize` > 1 asks it of ones that cannot (`auto` then trains them one at a time)."""
    try:
        if not algorithm.vectorizable:
            raise ConfigError(
                f"ray.vectorize: {config.algorithm.name} trains its clients one at a time; use ray.vectorize: 1"
            )
        check_vectorizable(probe, f"model {config.model.name}")
        return True
    except ConfigError:
        if config.ray.vectorize not in ("auto", 1):
            raise
        return False


def actor_memory(config: RunConfig) -> tuple[int, str] | None:
    """The bytes of device memory one client actor trains in, and what they are: a GPU actor's
    share of the GPU this process sees (`ray.gpus_per_actor` x its memory), or on CPUs the host's
    memory (an actor cannot have more); None for a GPU actor where this process sees no GPU."""
    import psutil
    import torch

    gpus = config.ray.gpus_per_actor
    if gpus > 0:
        if not torch.cuda.is_available():
            return None
        total = torch.cuda.get_device_properties(0).total_memory
        return int(min(1.0, gpus) * total), f"a client actor's share ({min(1.0, gpus):g}) of the GPU"
    return int(psutil.virtual_memory().total), "this host's memory"


def check_width(config: RunConfig, each: int) -> None:
    """`ConfigError` naming `ray.vectorize` when K clients of the run's model cannot train at once
    in an actor's memory (`actor_memory`): K x the model's training memory under the run's batch
    size and optimizer (`ModelCost.training_memory`); K is `ray.vectorize`, at most a call's clients."""
    width, memory = config.ray.vectorize, actor_memory(config)
    if width == "auto" or memory is None:
        return
    width = min(width, config.call_size)
    if width == 1:
        return
    have, where = memory
    if width * each > have:
        raise ConfigError(
            f"ray.vectorize: {width} clients of model {config.model.name} need {width * each / 2**30:.1f} GiB of "
            f"training memory at once; {where} holds {have / 2**30:.1f} GiB ({have // each} clients)"
        )


def width_memory(config: RunConfig, training_memory: Callable[[ModelConfig], int], rate: float) -> int:
    """A `memory_width` budget: the training memory of the run's model at width `rate`. The
    width is set without validation, so rates above 1 measure a wider network than any config allows."""
    if not hasattr(config.model, "rate"):
        raise ConfigError(f"devices.profile: memory_width budgets need a width-scalable model, not {config.model.name}")
    return training_memory(config.model.model_copy(update={"rate": rate}))

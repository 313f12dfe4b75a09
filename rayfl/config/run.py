"""A run's whole config: its sections, the `model` and `algorithm` bases that model families and
algorithms extend with their own keys, and the resolved config as plain YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, SerializeAsAny, field_validator, model_validator

from .base import Strict
from .data import DataConfig
from .devices import DevicesConfig
from .federation import FederationConfig
from .ray import RayConfig, Resources


class ModelConfig(Strict):
    """Base of every model family's config; families add their own keys."""

    name: str = "cnn"
    init_weights: Path | None = Field(
        None,
        description="a state dict saved with torch.save: the global model starts from its tensors whose names and "
        "shapes match (a new head keeps its initialisation)",
    )

    @field_validator("init_weights")
    @classmethod
    def _init_weights_exist(cls, v: Path | None) -> Path | None:
        if v is not None and not Path(v).expanduser().is_file():
            raise ValueError(f"{v} is not a file")
        return v


class AlgorithmConfig(Strict):
    """Base of every algorithm's config; algorithms add their own keys."""

    name: str = "fedavg"
    record: ClassVar[Any] = None
    """The algorithm this config class serves (`rayfl.algorithms.registry.Algorithm`), set when it
    registers: a config parsed by `rayfl.load.parse_config` carries its algorithm."""


class MetricsConfig(Strict):
    tensorboard: bool = Field(
        True, description="write each round's scalars and the config as TensorBoard events under RUN_DIR/tb"
    )


class RunConfig(Strict):
    seed: int = Field(0, ge=0)
    data: DataConfig = DataConfig()
    model: SerializeAsAny[ModelConfig] = ModelConfig()
    algorithm: SerializeAsAny[AlgorithmConfig] = AlgorithmConfig()
    federation: FederationConfig = FederationConfig()
    devices: DevicesConfig = DevicesConfig()
    clock: Literal["virtual", "emulate"] = "virtual"
    clock_scale: float = Field(1.0, gt=0, description="under clock: emulate, wall seconds per virtual second")
    ray: RayConfig = RayConfig()
    metrics: MetricsConfig = MetricsConfig()

    @property
    def resources(self) -> Resources:
        """What the run's client actors take and how many it asks for (`ray.Resources`)."""
        return Resources.of(self.ray, self.federation.clients_per_round)

    @property
    def call_size(self) -> int:
        """`ray.clients_per_call` resolved (`Resources.call_size`)."""
        return self.resources.call_size

    @model_validator(mode="after")
    def _round_fits_population(self) -> "RunConfig":
        fed, n = self.federation, self.data.num_clients
        if fed.clients_per_round > n:
            raise ValueError(f"federation.clients_per_round ({fed.clients_per_round}) exceeds data.num_clients ({n})")
        if fed.mode == "deadline" and fed.deadline.selected(fed.target_clients) > n:
            raise ValueError(
                f"federation.deadline: K = {fed.target_clients} with over_selection {fed.deadline.over_selection:g} "
                f"selects {fed.deadline.selected(fed.target_clients)} clients; data.num_clients is {n}"
            )
        if fed.mode == "deadline" and fed.deadline.min_reports > fed.target_clients:
            raise ValueError(
                f"federation.deadline.min_reports ({fed.deadline.min_reports}) exceeds K = {fed.target_clients}, the "
                "updates that close a round: every round would be abandoned"
            )
        if fed.mode == "async" and fed.concurrency > n:
            raise ValueError(f"federation.async.concurrency ({fed.concurrency}) exceeds data.num_clients ({n})")
        initial = self.devices.population.initial
        if initial is not None and initial > n:
            raise ValueError(f"devices.population.initial ({initial}) exceeds data.num_clients ({n})")
        if self.devices.population.arrivals_per_hour > 0 and (initial or n) >= n:
            raise ValueError(
                f"devices.population: arrivals need client ids to arrive as; set initial below data.num_clients ({n})"
            )
        if fed.mode != "sync" and self.clock == "emulate":
            raise ValueError(
                f"clock: emulate paces synchronous rounds only; federation.mode {fed.mode} runs on the virtual clock"
            )
        return self


def to_dict(config: RunConfig) -> dict[str, Any]:
    """The resolved config as plain YAML-safe data."""
    return config.model_dump(mode="json", by_alias=True)

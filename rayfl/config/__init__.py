"""A run's configuration: the schema (validated, frozen pydantic models, one module per section)
and YAML files read safely with `--set` overrides (`files`).

The key names are the ones docs/config.md documents. Unknown keys and wrong types are errors
that name the offending key (`ConfigError`, worded by `files.format_error`). This package's
`__init__` holds the schema only. Loading a config (`rayfl.load`: YAML and `--set` to a validated
config) validates the model and algorithm sections with the class their family or algorithm
registers, so it lives above the registries, outside this package (docs/design.md).
"""

from .base import (
    MAX_ACTORS,
    MAX_CLIENTS,
    MAX_DEPTH,
    MAX_PER_ROUND,
    MAX_ROUNDS,
    MAX_SHOWN,
    MAX_YAML_BYTES,
    MAX_YAML_NODES,
    WHOLE_POPULATION,
    ConfigError,
    Strict,
    shown,
)
from .data import (
    DataConfig,
    DirichletPartition,
    FlwrPartition,
    HFFeatures,
    IidPartition,
    NaturalPartition,
    NonIidLevelPartition,
    PartitionConfig,
    SampledPartition,
    ShardsPartition,
    SyntheticConfig,
)
from .devices import (
    Availability,
    BernoulliAvailability,
    DevicesConfig,
    DiurnalAvailability,
    PopulationConfig,
    TraceAvailability,
    mix_shares,
)
from .federation import (
    AsyncConfig,
    ConstantSchedule,
    CosineSchedule,
    DeadlineConfig,
    ExponentialSchedule,
    FederationConfig,
    GradClip,
    LrSchedule,
    MultiStepSchedule,
    Schedule,
    StalenessConfig,
)
from .ray import RayConfig, Resources
from .run import AlgorithmConfig, MetricsConfig, ModelConfig, RunConfig, to_dict

__all__ = [
    "MAX_ACTORS",
    "MAX_CLIENTS",
    "MAX_DEPTH",
    "MAX_PER_ROUND",
    "MAX_ROUNDS",
    "MAX_SHOWN",
    "MAX_YAML_BYTES",
    "MAX_YAML_NODES",
    "WHOLE_POPULATION",
    "AlgorithmConfig",
    "AsyncConfig",
    "Availability",
    "BernoulliAvailability",
    "ConfigError",
    "ConstantSchedule",
    "CosineSchedule",
    "DataConfig",
    "DeadlineConfig",
    "DevicesConfig",
    "DirichletPartition",
    "DiurnalAvailability",
    "ExponentialSchedule",
    "FederationConfig",
    "FlwrPartition",
    "GradClip",
    "HFFeatures",
    "IidPartition",
    "LrSchedule",
    "MetricsConfig",
    "ModelConfig",
    "MultiStepSchedule",
    "NaturalPartition",
    "NonIidLevelPartition",
    "PartitionConfig",
    "PopulationConfig",
    "RayConfig",
    "Resources",
    "RunConfig",
    "SampledPartition",
    "Schedule",
    "ShardsPartition",
    "StalenessConfig",
    "Strict",
    "SyntheticConfig",
    "TraceAvailability",
    "mix_shares",
    "shown",
    "to_dict",
]

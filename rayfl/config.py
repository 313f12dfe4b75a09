"""Run configuration schema: validated, frozen pydantic models (no registry is imported here).

The key names are the ones docs/config.md documents. Unknown keys and
wrong types are errors that name the offending key (`ConfigError`, worded by
`configfile.format_error`). `rayfl.loader` reads YAML,
applies `--set` overrides and validates the model and algorithm sections with the config class
their family or algorithm registers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import ConfigDict, Field, SerializeAsAny, ValidationInfo, field_validator, model_validator

from .config_devices import DevicesConfig
from .config_ray import RayConfig
from .configbase import (
    MAX_CLIENTS,
    MAX_PER_ROUND,
    MAX_ROUNDS,
    Strict,
)  # ConfigError: every module raises it from here
from .configbase import (
    ConfigError as ConfigError,
)

# ----------------------------------------------------------------------------- data


class IidPartition(Strict):
    """Every client gets an equal-size uniform random share."""

    kind: Literal["iid"] = "iid"


class DirichletPartition(Strict):
    """Label skew from a Dirichlet(alpha) draw.

    Unbalanced (default): each class is split over clients by Dir(alpha * 1_N), so sizes vary.
    Balanced: each client has n/N samples whose label mix is Dir(alpha * q), q the global prior.
    """

    kind: Literal["dirichlet"] = "dirichlet"
    alpha: float = Field(0.5, gt=0, description="concentration alpha; smaller is more skewed")
    balanced: bool = False
    min_size: int = Field(2, ge=0, description="resample until every client holds at least this many")


class ShardsPartition(Strict):
    """HeteroFL's non-iid-k: at most k classes per client, contiguous shards per class."""

    kind: Literal["shards"] = "shards"
    classes_per_client: int = Field(2, ge=1, description="k of non-iid-k")


class NonIidLevelPartition(Strict):
    """MergeSFL's non-IID level p = 1/delta: balanced Dir(delta * q); p = 0 is IID."""

    kind: Literal["noniid_level"] = "noniid_level"
    p: float = Field(0.0, ge=0, description="non-IID level p = 1/delta")


class SampledPartition(Strict):
    """Each client draws `size` samples from the pool when its task runs, keyed by (seed,
    client): any number of logical clients at no cost until drawn; clients may share samples."""

    kind: Literal["sampled"] = "sampled"
    mix: Literal["iid", "dirichlet"] = Field(
        "dirichlet", description="iid: a uniform draw; dirichlet: label mix Dir(alpha * q)"
    )
    alpha: float = Field(0.5, gt=0, description="concentration alpha of the label mix")
    size: int = Field(50, ge=1, description="samples per client")


class NaturalPartition(Strict):
    """The dataset's own clients: `synthetic` generates one distribution per client; a Hugging
    Face dataset with a client column (FEMNIST's writers) splits `by` it."""

    kind: Literal["natural"] = "natural"
    by: str | None = Field(
        None,
        description="the column naming each sample's client (data.name: hf); its values in sorted order are clients 0, 1, ...",
    )


class FlwrPartition(Strict):
    """A Flower Datasets partitioner (`flwr_datasets.partitioner.<partitioner>`, installed
    separately: pip install flwr-datasets) over a Hugging Face dataset's training split, built
    with `num_partitions = data.num_clients` and the other keys given here (alpha, partition_by, ...)."""

    model_config = ConfigDict(extra="allow")
    kind: Literal["flwr"] = "flwr"
    partitioner: str = Field(description="a class of flwr_datasets.partitioner, e.g. DirichletPartitioner")


PartitionConfig = Annotated[
    Union[
        IidPartition,
        DirichletPartition,
        ShardsPartition,
        NonIidLevelPartition,
        SampledPartition,
        NaturalPartition,
        FlwrPartition,
    ],
    Field(discriminator="kind"),
]


class SyntheticConfig(Strict):
    """FedProx's Synthetic(alpha, beta) generator (Li et al., MLSys 2020, Sec. 5.1)."""

    alpha: float = Field(1.0, ge=0, description="spread of the per-client models u_k ~ N(0, alpha)")
    beta: float = Field(1.0, ge=0, description="spread of the per-client inputs B_k ~ N(0, beta)")
    dim: int = Field(60, ge=1)
    num_classes: int = Field(10, ge=2)
    mean_samples: int = Field(100, ge=4, description="mean of the log-normal client sizes")


class HFFeatures(Strict):
    """Which columns of a Hugging Face dataset are the input and the label."""

    image: str | None = Field(
        None, description="an image column: decoded, resized to image_size, scaled and standardized"
    )
    text: str | None = Field(
        None,
        description="a text column: hashed into text_dim token counts (scikit-learn's HashingVectorizer), l2-normed",
    )
    label: str = "label"
    image_size: tuple[int, int] | None = Field(
        None, description="[H, W] every image is resized to (default: the first training image's)"
    )
    text_dim: int = Field(1024, ge=1, description="features of a hashed text")

    @model_validator(mode="after")
    def _one_input(self) -> "HFFeatures":
        if (self.image is None) == (self.text is None):
            raise ValueError("data.features: name one input column, image or text")
        return self


class DataConfig(Strict):
    name: str = "digits"
    data_dir: Path | None = None
    download: bool = False
    num_clients: int = Field(20, ge=1, le=MAX_CLIENTS)
    partition: PartitionConfig = DirichletPartition()
    synthetic: SyntheticConfig = SyntheticConfig()
    path: str | None = Field(
        None,
        description="data.name hf: a Hugging Face hub id, or a local folder or file (imagefolder, csv, json, parquet)",
    )
    split: str = Field("train", description="data.name hf: the training split")
    test_split: str | None = Field(
        "test",
        description="data.name hf: the test split; when the dataset has none, a seeded 20% of the training split",
    )
    features: HFFeatures | None = Field(None, description="data.name hf: the input and label columns")

    @model_validator(mode="after")
    def _hf(self) -> "DataConfig":
        if self.name == "hf" and (self.path is None or self.features is None):
            raise ValueError(
                "data: name hf needs data.path and data.features ({image: COLUMN} or {text: COLUMN}, label: COLUMN)"
            )
        if isinstance(self.partition, FlwrPartition) and self.name != "hf":
            raise ValueError("data.partition: kind flwr partitions a Hugging Face dataset (data.name: hf)")
        if isinstance(self.partition, NaturalPartition) and self.partition.by is not None and self.name != "hf":
            raise ValueError("data.partition.by: splits a Hugging Face dataset by a column (data.name: hf)")
        return self


# ----------------------------------------------------------------------------- model, algorithm


class ModelConfig(Strict):
    """Base of every model family's config; families add their own keys."""

    name: str = "cnn"
    init_weights: Path | None = Field(
        None,
        description="a state dict saved with torch.save: the global model starts from its tensors whose names and shapes match (a new head keeps its initialisation)",
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


# ----------------------------------------------------------------------------- federation


class Schedule(Strict):
    """What every schedule kind has: a linear warm-up (FedSup Sec. 4.1: 20 rounds, then cosine
    from 0.1). Rounds 1..W take lr * r / W; the schedule then runs over the other R - W rounds as
    it would over a whole run of that length (round W + 1 takes lr)."""

    warmup_rounds: int = Field(
        0,
        ge=0,
        description="W: rounds over which the rate rises linearly to lr (round r: lr r / W) before the schedule starts",
    )


class ConstantSchedule(Schedule):
    """The same learning rate every round."""

    kind: Literal["constant"] = "constant"


class ExponentialSchedule(Schedule):
    """lr_r = max(lr * gamma^(r-1), min_lr) (MergeSFL: gamma 0.993, min_lr 0.005)."""

    kind: Literal["exponential"] = "exponential"
    gamma: float = Field(0.993, gt=0, le=1, description="decay per round")
    min_lr: float = Field(0.0, ge=0, description="floor of the decayed rate")


class MultiStepSchedule(Schedule):
    """lr times gamma at each milestone (HeteroFL: MultiStepLR, gamma 0.1, stepped per round)."""

    kind: Literal["multistep"] = "multistep"
    milestones: list[float] = Field(
        min_length=1, description="fractions of the rounds in (0, 1), or round numbers >= 1"
    )
    gamma: float = Field(0.1, gt=0, le=1)

    @field_validator("milestones")
    @classmethod
    def _milestones(cls, v: list[float]) -> list[float]:
        fractions = all(0 < m < 1 for m in v)
        rounds = all(m >= 1 and float(m).is_integer() for m in v)
        if not (fractions or rounds):
            raise ValueError("give fractions of the rounds (all in (0, 1)) or round numbers (all integers >= 1)")
        if sorted(v) != list(v):
            raise ValueError("milestones must be in increasing order")
        return v


class CosineSchedule(Schedule):
    """Cosine annealing over the rounds: min_lr + (lr - min_lr)(1 + cos(pi (r-1) / R)) / 2 (FeDepth's code)."""

    kind: Literal["cosine"] = "cosine"
    min_lr: float = Field(0.0, ge=0)


LrSchedule = Annotated[
    Union[ConstantSchedule, ExponentialSchedule, MultiStepSchedule, CosineSchedule],
    Field(discriminator="kind"),
]


class GradClip(Strict):
    """Gradient clipping before each local step: the norm over the optimizer's parameters
    (`torch.nn.utils.clip_grad_norm_`) or every entry (`clip_grad_value_`)."""

    kind: Literal["norm", "value"] = "norm"
    max: float = Field(gt=0, allow_inf_nan=False, description="the largest norm, or the largest |entry|")

    @model_validator(mode="before")
    @classmethod
    def _a_number_is_a_norm(cls, v: Any) -> Any:
        return {"kind": "norm", "max": v} if isinstance(v, (int, float)) and not isinstance(v, bool) else v


class StalenessConfig(Strict):
    """s(t - tau): the weight of an update t - tau model versions old (Xie, Koyejo, Gupta 2019,
    "Asynchronous Federated Optimization", Sec. 5.2): constant 1; polynomial (t - tau + 1)^-a
    (a = 0.5 is FedBuff's 1 / sqrt(1 + staleness)); hinge 1 up to b, then 1 / (a (t - tau - b) + 1)."""

    kind: Literal["constant", "polynomial", "hinge"] = "polynomial"
    a: float = Field(0.5, gt=0, allow_inf_nan=False, description="the decay a (polynomial, hinge)")
    b: float = Field(4.0, ge=0, allow_inf_nan=False, description="the versions a hinge keeps at weight 1")


class DeadlineConfig(Strict):
    """`federation.mode: deadline` (Bonawitz et al. 2019, "Towards Federated Learning at Scale",
    Sec. 2.2): select ceil(K (1 + over_selection)) clients, close the round at the K-th update or
    at the deadline, whichever comes first."""

    target_clients: int | None = Field(
        None,
        ge=1,
        le=MAX_PER_ROUND,
        description="K: the updates that close a round (None: federation.clients_per_round)",
    )
    over_selection: float = Field(0.3, ge=0, allow_inf_nan=False, description="select this fraction more than K")
    deadline_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="virtual seconds after its start a round closes at the latest (None: no deadline)",
    )
    late: Literal["drop", "carry"] = Field(
        "drop", description="a late update: dropped, or carried into the round it arrives in, weighted by its staleness"
    )


class AsyncConfig(Strict):
    """`federation.mode: async`: `concurrency` clients always in flight, each replaced the moment
    it reports; the server steps by FedAsync's rule (Xie et al. 2019) or FedBuff's (Nguyen et
    al., AISTATS 2022)."""

    rule: Literal["fedasync", "fedbuff"] = Field(
        "fedbuff", description="fedasync: mix every update in; fedbuff: a server step per buffer_size updates"
    )
    concurrency: int | None = Field(
        None, ge=1, le=MAX_PER_ROUND, description="clients in flight (None: federation.clients_per_round)"
    )
    buffer_size: int = Field(5, ge=1, description="FedBuff's K: updates per server step (at most concurrency)")
    mixing: float = Field(
        0.6,
        gt=0,
        le=1,
        description="FedAsync's alpha: x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new, alpha_t = alpha s(t - tau)",
    )


class FederationConfig(Strict):
    mode: Literal["sync", "deadline", "async"] = Field(
        "sync",
        description="sync: every round waits for its slowest client; deadline: over-select, close at K updates or the deadline; async: FedAsync / FedBuff",
    )
    deadline: DeadlineConfig = DeadlineConfig()
    asynchronous: AsyncConfig = Field(AsyncConfig(), alias="async")
    staleness: StalenessConfig = Field(
        StalenessConfig(), description="how a stale update is weighted (async, and deadline with late: carry)"
    )
    rounds: int = Field(30, ge=1, le=MAX_ROUNDS, description="rounds; under mode async, server steps (model versions)")
    clients_per_round: int = Field(10, ge=1, le=MAX_PER_ROUND)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(10, ge=1)
    optimizer: Literal["sgd", "adam"] = Field(
        "sgd", description="the clients' local optimizer (and a split top model's)"
    )
    lr: float = Field(0.05, gt=0)
    lr_schedule: LrSchedule = Field(ConstantSchedule(), description="lr over rounds; the server sets each round's rate")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum (sgd only)")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: GradClip | None = Field(
        None,
        description="clip each step's gradients: {kind: norm|value, max: M}; a number M is {kind: norm, max: M} (HeteroFL: norm 1; FedSup's code: value 1)",
    )
    eval_every: int = Field(1, ge=1, description="evaluate the global model every k rounds (and the last)")
    eval_clients: int = Field(
        1000,
        ge=1,
        le=MAX_PER_ROUND,
        description="where test data is per client (synthetic): evaluate on a seeded sample of this many clients",
    )
    eval_batch_size: int = Field(500, ge=1)
    personalize_epochs: int = Field(
        0,
        ge=0,
        description="at each evaluation, fine-tune the head this many epochs per client and report initial_accuracy / personal_accuracy (FedSup Sec. 4.1); 0: off",
    )
    personalize_lr: float | None = Field(None, gt=0, description="the head fine-tuning rate (None: lr)")
    checkpoint_every: int = Field(10, ge=0, description="save the server state every k rounds (and the last); 0 never")
    max_failed_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="on Ray: a round that lost more than this fraction of its clients to dying client actors (not their own failures) runs them again instead of recording them",
    )
    target_accuracy: float | None = Field(
        None, gt=0, le=1, description="summary.json reports the virtual time to reach it"
    )

    @model_validator(mode="after")
    def _buffer_fits(self) -> "FederationConfig":
        if (
            self.mode == "async"
            and self.asynchronous.rule == "fedbuff"
            and self.asynchronous.buffer_size > self.concurrency
        ):
            raise ValueError(
                f"federation.async.buffer_size ({self.asynchronous.buffer_size}) exceeds the clients in flight, federation.async.concurrency ({self.concurrency}): the buffer would never fill"
            )
        return self

    @model_validator(mode="after")
    def _warmup_fits(self) -> "FederationConfig":
        if self.lr_schedule.warmup_rounds >= self.rounds:
            raise ValueError(
                f"federation.lr_schedule.warmup_rounds ({self.lr_schedule.warmup_rounds}) leaves no round of the schedule: give fewer than federation.rounds ({self.rounds})"
            )
        return self

    @property
    def target_clients(self) -> int:
        """Deadline mode's K (default `clients_per_round`)."""
        return self.deadline.target_clients or self.clients_per_round

    @property
    def selected_clients(self) -> int:
        """The clients a round selects: `clients_per_round`, or under `mode: deadline`
        ceil(K (1 + over_selection))."""
        if self.mode != "deadline":
            return self.clients_per_round
        return math.ceil(self.target_clients * (1 + self.deadline.over_selection) - 1e-9)

    @property
    def concurrency(self) -> int:
        """Async mode's clients in flight (default `clients_per_round`)."""
        return self.asynchronous.concurrency or self.clients_per_round

    @field_validator("momentum")
    @classmethod
    def _momentum_is_sgd_only(cls, v: float, info: ValidationInfo) -> float:
        if v and info.data.get("optimizer", "sgd") != "sgd":
            raise ValueError(f"applies to optimizer sgd only ({info.data['optimizer']} keeps its own moments)")
        return v


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
    def call_size(self) -> int:
        """`ray.clients_per_call` resolved: `auto` is 5 on CPUs; with `ray.gpus_per_actor`, the
        round's clients per actor (`ray.num_actors`, under `auto` the actors one GPU holds), so a
        GPU actor trains its share of a round in one call, vectorized (`ray.vectorize: auto`)."""
        ray_cfg = self.ray
        if ray_cfg.clients_per_call != "auto":
            return ray_cfg.clients_per_call
        if ray_cfg.gpus_per_actor == 0:
            return 5
        actors = (
            ray_cfg.num_actors
            if ray_cfg.num_actors != "auto"
            else max(1, math.floor(1 / ray_cfg.gpus_per_actor + 1e-9))
        )
        return math.ceil(self.federation.clients_per_round / actors)

    @model_validator(mode="after")
    def _round_fits_population(self) -> "RunConfig":
        fed, n = self.federation, self.data.num_clients
        if fed.clients_per_round > n:
            raise ValueError(f"federation.clients_per_round ({fed.clients_per_round}) exceeds data.num_clients ({n})")
        if fed.mode == "deadline" and fed.selected_clients > n:
            raise ValueError(
                f"federation.deadline: K = {fed.target_clients} with over_selection {fed.deadline.over_selection:g} selects {fed.selected_clients} clients; data.num_clients is {n}"
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


# ----------------------------------------------------------------------------- files


def to_dict(config: RunConfig) -> dict[str, Any]:
    """The resolved config as plain YAML-safe data."""
    return config.model_dump(mode="json", by_alias=True)


def dump_config(config: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (`storage.write_atomic`: never half a file); `load_config(path)` gives back an equal object."""
    from .storage import write_atomic

    write_atomic(path, yaml.safe_dump(to_dict(config), sort_keys=False))

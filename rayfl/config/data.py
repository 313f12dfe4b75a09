"""The `data` section: which dataset, how many logical clients and how it is partitioned among
them (docs/data.md); `rayfl.data` implements it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import ConfigDict, Field, model_validator

from .base import MAX_CLIENTS, Strict


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
        description="the column naming each sample's client (data.name: hf); its values in sorted order are clients "
        "0, 1, ...",
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

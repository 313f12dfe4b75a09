"""Datasets and partitioners (Ray-free)."""

from rayfl.data.partition import Partition, partition
from rayfl.data.sources import Dataset, load_dataset, sources

__all__ = ["Dataset", "Partition", "load_dataset", "partition", "sources"]

"""Datasets and partitioners (Ray-free)."""

from .partition import Partition, partition
from .sources import Dataset, load_dataset, sources

__all__ = ["Dataset", "Partition", "load_dataset", "partition", "sources"]

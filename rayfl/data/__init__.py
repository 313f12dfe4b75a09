"""Data sources, partitioners and the logical clients they make (Ray-free)."""

from . import hf  # noqa: F401  (registers data.name: hf)
from .clients import Clients, Partitioned, Sampled, SyntheticClients
from .partition import load_clients, partition
from .sources import Dataset, load_dataset, sources

__all__ = [
    "Clients",
    "Dataset",
    "Partitioned",
    "Sampled",
    "SyntheticClients",
    "load_clients",
    "load_dataset",
    "partition",
    "sources",
]

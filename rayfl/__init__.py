"""rayfl: simulate federated learning over heterogeneous devices on a Ray cluster.

The core (`rayfl.*` except `rayfl.cli` and `rayfl.api`) never imports ray.
"""

__version__ = "0.1.0"

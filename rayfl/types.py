"""Domain aliases shared by the core (as `fedjax/core/typing.py`)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

Weights = Mapping[str, np.ndarray]
"""A model state: state_dict names mapped to numpy arrays."""

ClientId = int
"""Index of a logical client, 0..num_clients-1."""

Round = int
"""Communication round, counted from 1."""

"""`rayfl traces import-fedscale`: FedScale's two pickled device files to rayfl's trace format.

FedScale (Lai et al., ICML 2022) ships `client_device_capacity`, a dict
{client_id: {'computation': ms per sample of inference, 'communication': kbit/s}}, and
`client_behave_trace`, a dict {client_id: {'active': [s], 'inactive': [s], 'finish_time': s,
'duration': s, 'model': str}} where a client is online in [active[i], inactive[i]] of its trace,
repeated every finish_time seconds (its `is_active`). FedScale trains a sample in 3x the
inference latency (`get_completion_time`'s augmentation factor) and counts a kbit as 1,024 bits
(the model size is bytes / 1024 * 8). Here: flops_per_s = reference_flops /
(computation / 1000), so a model of `reference_flops` forward FLOPs trains in FedScale's time
(its training FLOPs being 3x the forward, as `rayfl.devices.cost` counts them); up_bps = down_bps
= communication * 1024. Device i of the capacity file (in its order) takes the behaviour of the
(i mod M)-th client of the behaviour file, as FedScale pairs them by position.

Pickle runs code by design; these files are read by an unpickler that resolves no global at
all, so a file can hold only dicts, lists, numbers, strings (and None, booleans); anything
else is refused with one line before any of it is built.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..config import ConfigError
from .profile import ENERGY_J_PER_GFLOP, ENERGY_J_PER_MB

REFERENCE_FLOPS = 6.0e8
"""Forward FLOPs per sample of the model FedScale's latencies stand for: MobileNetV2, 300 M
multiply-adds (Sandler et al. 2018), which FedScale's speed factors are relative to."""


class DataOnly(pickle.Unpickler):
    """An unpickler that builds no object but dicts, lists, tuples, sets, numbers, strings and bytes: every
    global (a class, a function) is refused, so nothing in the file can run."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"holds a {module}.{name}; only dicts, lists, numbers and strings are read")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("holds a persistent reference; only dicts, lists, numbers and strings are read")


def read_pickle(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = DataOnly(io.BytesIO(path.read_bytes())).load()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except Exception as exc:  # a malformed stream raises any of several errors
        raise ConfigError(f"{path}: refused: {exc}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: refused: a dict of clients expected, found a {type(data).__name__}")
    return data


def _entry(path: Path, key: Any, entry: Any, fields: tuple[str, ...]) -> dict:
    if not isinstance(entry, dict) or any(f not in entry for f in fields):
        raise ConfigError(f"{path}: client {key!r}: a dict with {', '.join(fields)} expected")
    return entry


def import_fedscale(
    capacity: str | Path,
    behaviour: str | Path,
    reference_flops: float = REFERENCE_FLOPS,
    memory_mb: float = 1024.0,
    battery_j: float | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The trace tables (`rayfl.devices.trace` format) of FedScale's two files."""
    capacity, behaviour = Path(capacity), Path(behaviour)
    cap, beh = read_pickle(capacity), read_pickle(behaviour)
    if not cap or not beh:
        raise ConfigError(f"{capacity if not cap else behaviour}: no clients")
    keys = list(beh)
    rows, spans = [], []
    for i, (cid, entry) in enumerate(cap.items()):
        if not isinstance(cid, int):
            raise ConfigError(f"{capacity}: client {cid!r}: client ids must be whole numbers")
        e = _entry(capacity, cid, entry, ("computation", "communication"))
        b = _entry(behaviour, keys[i % len(keys)], beh[keys[i % len(keys)]], ("active", "inactive", "finish_time"))
        if not (
            isinstance(e["computation"], (int, float))
            and e["computation"] > 0
            and isinstance(e["communication"], (int, float))
            and e["communication"] > 0
        ):
            raise ConfigError(f"{capacity}: client {cid!r}: computation and communication must be numbers > 0")
        rows.append(
            (cid, reference_flops / (e["computation"] / 1000), e["communication"] * 1024, float(b["finish_time"]))
        )
        spans.extend((cid, float(a), float(z)) for a, z in zip(b["active"], b["inactive"]) if z > a)
    ids, speed, bps, period = zip(*rows)
    devices = pd.DataFrame(
        {
            "device_id": np.asarray(ids, np.int64),
            "flops_per_s": speed,
            "up_bps": bps,
            "down_bps": bps,
            "memory_bytes": np.full(len(ids), int(memory_mb * 2**20), np.int64),
            "energy_j_per_gflop": ENERGY_J_PER_GFLOP,
            "energy_j_per_mb": ENERGY_J_PER_MB,
            "battery_j": np.full(len(ids), np.nan if battery_j is None else battery_j),
            "period_s": period,
        }
    )
    intervals = pd.DataFrame(spans, columns=["device_id", "online_from_s", "online_to_s"]).astype(
        {"device_id": np.int64}
    )
    return devices, intervals

"""Device traces: one documented, pickle-free format (docs/devices.md), validated on load, and a
generator of realistic synthetic traces that needs no network.

A trace is a folder of two Parquet tables:
- `devices.parquet`: device_id, flops_per_s, up_bps, down_bps, memory_bytes, energy_j_per_gflop,
  energy_j_per_mb, battery_j (null: no limit), and optionally period_s (the device's intervals
  repeat every period_s; default the trace's span, its latest online_to_s);
- `intervals.parquet`: device_id, online_from_s, online_to_s (the device is online in
  [from, to)); optional when no run reads availability from the trace.
Each logical client is given a trace device drawn uniformly by (seed, client).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import rng
from ..config import ConfigError, DiurnalAvailability

DEVICE_COLUMNS = (
    "device_id",
    "flops_per_s",
    "up_bps",
    "down_bps",
    "memory_bytes",
    "energy_j_per_gflop",
    "energy_j_per_mb",
    "battery_j",
)
INTERVAL_COLUMNS = ("device_id", "online_from_s", "online_to_s")
POSITIVE = ("flops_per_s", "up_bps", "down_bps", "memory_bytes", "period_s")
NON_NEGATIVE = ("energy_j_per_gflop", "energy_j_per_mb")


@dataclass(frozen=True, eq=False)
class DeviceTrace:
    path: Path
    devices: pd.DataFrame
    intervals: pd.DataFrame | None

    def periods(self) -> np.ndarray:
        """Each device's repeat period: its period_s, or the trace's span."""
        span = float(self.intervals["online_to_s"].max()) if self.intervals is not None and len(self.intervals) else 1.0
        if "period_s" in self.devices:
            return self.devices["period_s"].fillna(span).to_numpy(float)
        return np.full(len(self.devices), span)

    def assign(self, num_clients: int, seed: int) -> np.ndarray:
        """(num_clients,) the row of the trace device each logical client is given."""
        return rng.generator(seed, "trace-device").integers(len(self.devices), size=num_clients)


def _read(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except Exception as exc:  # pyarrow's errors name no common base
        raise ConfigError(f"{path}: not a readable Parquet table ({type(exc).__name__})") from None
    for col in columns:
        if col not in frame:
            raise ConfigError(f"{path}: missing column {col}")
    for col in frame.columns:
        if col in (*columns, "period_s") and not pd.api.types.is_numeric_dtype(frame[col]):
            raise ConfigError(f"{path}: column {col}: numbers expected, found {frame[col].dtype}")
    return frame


def _check(path: Path, frame: pd.DataFrame, col: str, bad: pd.Series, rule: str) -> None:
    if bad.any():
        row = frame[bad].iloc[0]
        raise ConfigError(f"{path}: column {col}: {row[col]!r} for device_id {row['device_id']} ({rule})")


def load_trace(folder: str | Path, need_intervals: bool = False) -> DeviceTrace:
    """Read and validate a trace folder; `ConfigError` naming the file and column at fault."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"devices.trace: {folder} is not a folder (a trace is devices.parquet and intervals.parquet)")
    dpath, ipath = folder / "devices.parquet", folder / "intervals.parquet"
    devices = _read(dpath, DEVICE_COLUMNS)
    if devices["device_id"].duplicated().any():
        _check(dpath, devices, "device_id", devices["device_id"].duplicated(), "each device once")
    if not len(devices):
        raise ConfigError(f"{dpath}: no devices")
    for col in POSITIVE:
        if col in devices:
            values = devices[col].fillna(1.0) if col == "period_s" else devices[col]
            _check(dpath, devices, col, ~(np.isfinite(values) & (values > 0)), "must be a finite number > 0")
    for col in NON_NEGATIVE:
        _check(dpath, devices, col, ~(np.isfinite(devices[col]) & (devices[col] >= 0)), "must be a finite number >= 0")
    battery = devices["battery_j"]
    _check(dpath, devices, "battery_j", battery.notna() & ~(battery > 0), "must be > 0, or null for no limit")
    intervals = None
    if ipath.is_file() or need_intervals:
        intervals = _read(ipath, INTERVAL_COLUMNS)
        _check(
            ipath,
            intervals,
            "online_to_s",
            ~(intervals["online_to_s"] > intervals["online_from_s"]),
            "an interval must end after it starts",
        )
        _check(ipath, intervals, "online_from_s", ~(intervals["online_from_s"] >= 0), "must be >= 0")
        _check(
            ipath, intervals, "device_id", ~intervals["device_id"].isin(devices["device_id"]), "not in devices.parquet"
        )
    trace = DeviceTrace(folder, devices.reset_index(drop=True), intervals)
    if intervals is not None:
        period = pd.Series(trace.periods(), index=devices["device_id"])
        late = intervals["online_to_s"] > intervals["device_id"].map(period) + 1e-9
        _check(ipath, intervals, "online_to_s", late, "ends after the device's period_s")
    return trace


def write_trace(devices: pd.DataFrame, intervals: pd.DataFrame | None, out: str | Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    devices.to_parquet(out / "devices.parquet", index=False)
    if intervals is not None:
        intervals.to_parquet(out / "intervals.parquet", index=False)
    return out


# The generator's parameters; docs/devices.md gives their reasons. Each is an assumption in the
# range the cited measurements report, not a fit to them.
COMPUTE_MEDIAN_FLOPS = 1.0e10
"""Median sustained training speed of a device model, FLOP/s."""
COMPUTE_SIGMA = 1.0
"""Log-normal spread across device models (5th to 95th percentile: a factor of 27)."""
DEVICE_MODELS = 200
NETWORKS = {
    # name: (share, median down Mb/s, median up Mb/s, log-sigma, J per MB)
    "wifi": (0.6, 20.0, 8.0, 0.8, 0.5),
    "lte": (0.3, 10.0, 3.0, 0.9, 2.0),
    "3g": (0.1, 1.5, 0.5, 0.7, 5.0),
}
MEMORY_MB = ((256, 0.3), (512, 0.5), (1024, 0.2))
BATTERY_MEDIAN_J = 1000.0
"""Median energy a device lets federated training spend between charges (about 2% of a 13 Wh phone battery)."""
DAY = DiurnalAvailability(kind="diurnal", on_fraction=0.3, session_s=1800.0, amplitude=0.8)


def generate_trace(num_devices: int, seed: int = 0, days: int = 7) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A synthetic trace of `num_devices` devices over `days` days (their intervals repeating
    after): heavy-tailed compute (log-normal over device models), bandwidth and radio energy per
    network type, memory tiers, battery budgets, and diurnal sessions (`Diurnal`)."""
    from .availability import Diurnal  # the generator alone replays the chain

    g = rng.generator(seed, "trace-generate")
    model_speed = COMPUTE_MEDIAN_FLOPS * np.exp(COMPUTE_SIGMA * g.standard_normal(DEVICE_MODELS))
    speed = model_speed[g.integers(DEVICE_MODELS, size=num_devices)] * np.exp(0.1 * g.standard_normal(num_devices))
    names = list(NETWORKS)
    net = g.choice(len(names), size=num_devices, p=[NETWORKS[n][0] for n in names])
    table = np.array([NETWORKS[n][1:] for n in names])
    jitter = np.exp(table[net, 2] * g.standard_normal((2, num_devices)))
    mem = np.array([m for m, _ in MEMORY_MB])[g.choice(len(MEMORY_MB), size=num_devices, p=[p for _, p in MEMORY_MB])]
    devices = pd.DataFrame(
        {
            "device_id": np.arange(num_devices),
            "flops_per_s": speed,
            "up_bps": table[net, 1] * 1e6 * jitter[1],
            "down_bps": table[net, 0] * 1e6 * jitter[0],
            "memory_bytes": mem.astype(np.int64) * 2**20,
            "energy_j_per_gflop": 0.1 * np.exp(0.3 * g.standard_normal(num_devices)),
            "energy_j_per_mb": table[net, 3],
            "battery_j": BATTERY_MEDIAN_J * np.exp(0.5 * g.standard_normal(num_devices)),
            "period_s": np.full(num_devices, days * DAY.period_s),
            "network": np.array(names)[net],
        }
    )
    dev, frm, to = Diurnal(DAY, num_devices, seed).sessions(days * DAY.period_s)
    intervals = pd.DataFrame({"device_id": dev, "online_from_s": frm, "online_to_s": to}).sort_values(
        ["device_id", "online_from_s"], kind="stable"
    )
    return devices, intervals.reset_index(drop=True)

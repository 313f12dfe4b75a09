"""Checkpoints: the server state every K rounds under RUN_DIR/checkpoints/, for `--resume`.

Any server state checkpoints: `ServerState` and whatever it nests (per-group server optimizers,
per-client dicts of numbers, momentum buffers, ...) as long as it is built from dicts, lists,
tuples and dataclasses of numpy arrays, numbers, strings and None. It is written as plain data
(`encode`: arrays become tensors, a dataclass a tagged dict of its fields) with `torch.save`,
and read with `torch.load(weights_only=True)`, so loading one never runs code from the file. A
dataclass is written and rebuilt only when its module registered it (`rayfl/statetypes.py`:
rayfl's own state types, and a policy's); what a file decodes to must be a `ServerState` with
its clock (and a scheduler's `Pending`, the devices' `Batteries`), else the file is passed over
as broken. A checkpoint is written whole or not at all (`storage.write_atomic`). Randomness is
keyed by (seed, round, client, purpose), hence a resumed run equals one that never stopped.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .algorithms.messages import ServerState
from .config import ConfigError
from .statetypes import STATE_TYPES, state_name
from .storage import write_atomic

FOLDER = "checkpoints"
log = logging.getLogger("rayfl")
_DATACLASS = "__dataclass__"


def encode(value: Any, where: str = "state") -> Any:
    """Plain data for `torch.save(weights_only-loadable)`: arrays -> tensors, dataclasses -> tagged
    dicts, numpy scalars -> 0-d arrays; `TypeError` naming the path of anything else."""
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        if value.dtype == object or value.dtype.kind in "USV":
            raise TypeError(f"{where}: cannot checkpoint a numpy array of dtype {value.dtype}")
        return torch.from_numpy(np.array(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = state_name(type(value))
        if name not in STATE_TYPES:
            raise TypeError(
                f"{where}: {name} is not a checkpoint state type (register it with @rayfl.statetypes.state_type)"
            )
        fields = {
            f.name: encode(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value) if f.init
        }
        return {_DATACLASS: name, "fields": fields}
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            key = int(k) if isinstance(k, np.integer) else k
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"{where}: cannot checkpoint a dict key of type {type(k).__name__}")
            out[key] = encode(v, f"{where}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        items = [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(f"{where}: cannot checkpoint a value of type {type(value).__name__}")


def decode(value: Any) -> Any:
    """The inverse of `encode`: tensors -> numpy arrays, tagged dicts -> their dataclasses."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        if _DATACLASS in value:
            return _dataclass(value[_DATACLASS])(**{k: decode(v) for k, v in value["fields"].items()})
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(decode(v) for v in value)
    return value


def _dataclass(name: Any) -> type:
    """The state dataclass named `module:qualname` (`rayfl.statetypes.STATE_TYPES`); `ConfigError`
    for any other name."""
    if isinstance(name, str) and name in STATE_TYPES:
        return STATE_TYPES[name]
    raise ConfigError(f"checkpoint: {str(name)[:80]!r} is not one of rayfl's state types")


@dataclass(frozen=True)
class Saved:
    """A checkpoint as read back: the server state, the virtual clock, and what the run's
    scheduler keeps besides (the clients still in flight of a deadline or asynchronous run), or None."""

    state: ServerState
    virtual_time_s: float
    pending: Any = None
    batteries: Any = None
    """The devices' charge (`rayfl.engine.admission.Batteries`), or None."""
    config: Mapping[str, Any] | None = None
    """The resolved config of the run that wrote it (`rayfl.config.to_dict`), which a resume must
    agree with (`rayfl.engine.loop.start_of`); None in a file written without one."""
    path: Path | None = None
    """The file it was read from."""


def save(
    run_dir: str | Path,
    state: ServerState,
    virtual_time_s: float,
    pending: Any = None,
    batteries: Any = None,
    config: Mapping[str, Any] | None = None,
) -> Path:
    folder = Path(run_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    data = dumps(state, virtual_time_s, pending, batteries, config)  # written by Python: a full disk names the file
    return write_atomic(folder / f"round_{state.round:05d}.pt", data)  # never half a checkpoint under its name


def dumps(
    state: ServerState,
    virtual_time_s: float,
    pending: Any = None,
    batteries: Any = None,
    config: Mapping[str, Any] | None = None,
) -> bytes:
    """A checkpoint's bytes (what `save` writes)."""
    buffer = io.BytesIO()
    torch.save(
        {
            "state": encode(state),
            "virtual_time_s": float(virtual_time_s),
            "pending": encode(pending, "pending"),
            "batteries": encode(batteries, "batteries"),
            "config": config,
        },
        buffer,
    )
    return buffer.getvalue()


def loads(data: bytes) -> Saved:
    """A checkpoint read back from its bytes: what a run continues from (`latest` reads a file's)."""
    return checked(torch.load(io.BytesIO(data), weights_only=True))


def _paths(run_dir: str | Path) -> list[Path]:
    return sorted((Path(run_dir) / FOLDER).glob("round_*.pt"))


def clear(run_dir: str | Path) -> None:
    """Remove the checkpoints of an earlier run in RUN_DIR: a fresh run into it must never resume
    (after a coordinator restart, or by `--resume`) from another run's state."""
    for path in _paths(run_dir):
        path.unlink()


def exists(run_dir: str | Path) -> bool:
    """Whether RUN_DIR holds a checkpoint to resume from."""
    return bool(_paths(run_dir))


def latest(run_dir: str | Path) -> Saved:
    """The newest intact checkpoint of a run. An unreadable newer
    one (a truncated file, say) is passed over, with a warning naming it; `ConfigError` names
    the folder when there is none, or the newest file when none can be read."""
    paths = _paths(run_dir)
    if not paths:
        raise ConfigError(f"--resume {run_dir}: no checkpoint under {Path(run_dir) / FOLDER}")
    broken: list[str] = []
    for path in reversed(paths):
        try:
            saved = dataclasses.replace(loads(path.read_bytes()), path=path)
        except Exception as exc:  # a broken file fails in the zip reader, the unpickler, decode or `checked`
            first = (str(exc).splitlines() or [""])[0][:120]
            broken.append(f"{path} ({first if isinstance(exc, ConfigError) else f'{type(exc).__name__}: {first}'})")
            continue
        if broken:
            log.warning(f"{' and '.join(broken)} unreadable: resuming from {path}")
        return saved
    older = f"; {len(paths) - 1} older unreadable too" if len(paths) > 1 else ""
    raise ConfigError(f"--resume {run_dir}: no readable checkpoint: {broken[0]}{older}")


def checked(data: Any) -> Saved:
    """A loaded file's contents as a `Saved`, or `ConfigError` saying what is not a checkpoint's:
    a mapping holding a `ServerState` (a round number, named arrays), a finite clock, and a
    `Pending` and `Batteries` or None."""
    if not isinstance(data, dict) or "state" not in data or "virtual_time_s" not in data:
        raise ConfigError("not a rayfl checkpoint (no state and virtual_time_s)")
    state, pending, batteries = decode(data["state"]), decode(data.get("pending")), decode(data.get("batteries"))
    clock = data["virtual_time_s"]
    if not isinstance(state, ServerState):
        raise ConfigError(f"its state is a {type(state).__name__}, not a ServerState")
    if not (
        isinstance(state.round, int)
        and state.round >= 0
        and isinstance(state.weights, dict)
        and all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in state.weights.items())
    ):
        raise ConfigError("its state's round is not a count or its weights are not named arrays")
    if not (isinstance(clock, numbers.Real) and np.isfinite(clock)):
        raise ConfigError("its virtual_time_s is not a finite number")
    if not (pending is None or state_name(type(pending)) == "rayfl.engine.flights:Pending") or not (
        batteries is None or state_name(type(batteries)) == "rayfl.engine.admission:Batteries"
    ):
        raise ConfigError("its pending flights or batteries are not rayfl's")
    config = data.get("config")
    if not (config is None or isinstance(config, dict)):
        raise ConfigError("its config is not a mapping")
    return Saved(state, float(clock), pending, batteries, config)

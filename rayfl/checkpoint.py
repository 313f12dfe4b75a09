"""Checkpoints: the server state every K rounds under RUN_DIR/checkpoints/, for `--resume`.

Any server state checkpoints: `ServerState` and whatever it nests (per-group server optimizers,
per-client dicts of numbers, momentum buffers, ...) as long as it is built from dicts, lists,
tuples and dataclasses of numpy arrays, numbers, strings and None. It is written as plain data
(`encode`: arrays become tensors, a dataclass a tagged dict of its fields) with `torch.save`,
and read with `torch.load(weights_only=True)`, so loading one never runs code from the file; a
dataclass is rebuilt only from a class already loaded in this process. Randomness is keyed by
(seed, round, client, purpose), hence a resumed run equals one that never stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .algorithms.messages import ServerState
from .config import ConfigError

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
        fields = {f.name: encode(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value) if f.init}
        cls = type(value)
        return {_DATACLASS: f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
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


def _dataclass(name: str) -> type:
    """A dataclass named `module:qualname` in a module this process has already imported."""
    module_name, _, qualname = name.partition(":")
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise ConfigError(f"checkpoint: {name} is not a dataclass loaded in this process")
    return obj


@dataclass(frozen=True)
class Saved:
    """A checkpoint as read back: the server state, the virtual clock, and what the run's
    scheduler keeps besides (the clients still in flight of a deadline or asynchronous run), or None."""

    state: ServerState
    virtual_time_s: float
    pending: Any = None
    batteries: Any = None
    """The devices' charge (`rayfl.engine.admission.Batteries`), or None."""


def save(run_dir: str | Path, state: ServerState, virtual_time_s: float, pending: Any = None, batteries: Any = None) -> Path:
    folder = Path(run_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"round_{state.round:05d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save({"state": encode(state), "virtual_time_s": float(virtual_time_s), "pending": encode(pending, "pending"), "batteries": encode(batteries, "batteries")}, tmp)
    tmp.replace(path)  # never leave a half-written checkpoint under the final name
    return path


def _paths(run_dir: str | Path) -> list[Path]:
    return sorted((Path(run_dir) / FOLDER).glob("round_*.pt"))


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
            data = torch.load(path, weights_only=True)
            saved = Saved(decode(data["state"]), float(data["virtual_time_s"]), decode(data.get("pending")), decode(data.get("batteries")))
        except Exception as exc:  # a broken file fails in the zip reader, the unpickler or decode
            broken.append(f"{path} ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:80]})")
            continue
        if broken:
            log.warning(f"{' and '.join(broken)} unreadable: resuming from {path}")
        return saved
    raise ConfigError(f"--resume {run_dir}: no readable checkpoint ({paths[-1]} and {len(paths) - 1} older are corrupt)")

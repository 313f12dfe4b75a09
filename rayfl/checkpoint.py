"""Checkpoints: the server state every K rounds under RUN_DIR/checkpoints/, for `--resume`.

A checkpoint holds plain data only (numbers, strings, tensors), written with `torch.save` and
read with `torch.load(weights_only=True)`, so loading one never runs code from the file.
Randomness is keyed by (seed, round, client, purpose), hence a resumed run equals one that
never stopped.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .algorithms.base import ServerState
from .algorithms.server_opt import ServerOptState
from .config import ConfigError

FOLDER = "checkpoints"


def _tensors(arrays: Mapping[str, np.ndarray] | None) -> dict[str, torch.Tensor] | None:
    return None if arrays is None else {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}


def _arrays(tensors: Mapping[str, torch.Tensor] | None) -> dict[str, np.ndarray] | None:
    return None if tensors is None else {k: v.numpy() for k, v in tensors.items()}


def encode(state: ServerState) -> dict[str, Any]:
    """ServerState -> plain data. Per-client state must be name-keyed arrays (or empty)."""
    opt = state.opt_state
    if opt is not None and not isinstance(opt, ServerOptState):
        raise TypeError(f"cannot checkpoint server optimizer state of type {type(opt).__name__}")
    return {
        "round": state.round,
        "weights": _tensors(state.weights),
        "opt_state": None if opt is None else {**dataclasses.asdict(opt), "m": _tensors(opt.m), "v": _tensors(opt.v)},
        "clients": {int(c): _tensors(s) for c, s in state.clients.items()},
    }


def decode(data: Mapping[str, Any]) -> ServerState:
    opt = data["opt_state"]
    if opt is not None:
        opt = ServerOptState(**{**opt, "m": _arrays(opt["m"]), "v": _arrays(opt["v"])})
    clients = {int(c): _arrays(s) for c, s in data["clients"].items()}
    return ServerState(round=int(data["round"]), weights=_arrays(data["weights"]), opt_state=opt, clients=clients)


def save(run_dir: str | Path, state: ServerState, virtual_time_s: float) -> Path:
    folder = Path(run_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"round_{state.round:05d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save({"state": encode(state), "virtual_time_s": float(virtual_time_s)}, tmp)
    tmp.replace(path)  # never leave a half-written checkpoint under the final name
    return path


def _paths(run_dir: str | Path) -> list[Path]:
    return sorted((Path(run_dir) / FOLDER).glob("round_*.pt"))


def exists(run_dir: str | Path) -> bool:
    """Whether RUN_DIR holds a checkpoint to resume from."""
    return bool(_paths(run_dir))


def latest(run_dir: str | Path) -> tuple[ServerState, float]:
    """The newest checkpoint of a run: (server state, virtual time)."""
    paths = _paths(run_dir)
    if not paths:
        raise ConfigError(f"--resume {run_dir}: no checkpoint under {Path(run_dir) / FOLDER}")
    data = torch.load(paths[-1], weights_only=True)
    return decode(data["state"]), float(data["virtual_time_s"])

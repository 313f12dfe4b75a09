"""Names every rayfl process agrees on: the namespace of its named actors, a run's own actors' and
the warm pool's names, the head node's resource, the keys that say which pooled actor a run may
borrow, and how an actor call names a run's federation (`FederationRef`). Imports Ray and the
standard library only."""

from __future__ import annotations

import hashlib
import secrets
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import ray


@dataclass(frozen=True)
class FederationRef:
    """A run's federation in the object store, as an actor call passes it: Ray resolves an
    `ObjectRef` that is a call's own argument before the call, but not one inside an object, so
    each actor reads it itself (once: `ClientActor.hosting`), where and when it needs it."""

    ref: ray.ObjectRef

    def key(self) -> str:
        """The object's id: which run's federation an actor hosts."""
        return self.ref.hex()


NAMESPACE = "rayfl"
"""Named actors live here, so the dashboard, `ray list actors` and `ray.get_actor` find them."""
KEEPER = "rayfl:pool"
"""The warm pool's keeper (`actors/keeper.py`); pooled actors are named under it."""
HEAD_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node only."""


def actor_name(run_id: str, role: str) -> str:
    """A run's own actor, `rayfl:<run_id>:coordinator` or `rayfl:<run_id>:client-<k>`."""
    return f"rayfl:{run_id}:{role}"


def pooled_name(role: str) -> str:
    """A pooled actor, `rayfl:pool:<role>-<8 hex>`."""
    return f"{KEEPER}:{role}-{secrets.token_hex(4)}"


_DIGEST: list[str] = []


def code_digest() -> str:
    """What the actors run: the sources of `rayfl` and `actors` and the Python, torch and Ray
    versions, hashed (12 hex). An edited checkout never borrows actors running the old code."""
    if not _DIGEST:
        root = Path(__file__).resolve().parent.parent
        h = hashlib.sha256(f"{sys.version}|{metadata.version('torch')}|{ray.__version__}".encode())
        for path in sorted([*root.joinpath("rayfl").rglob("*.py"), *root.joinpath("actors").rglob("*.py")]):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
        _DIGEST.append(h.hexdigest()[:12])
    return _DIGEST[0]


def kinds(cpus: float, gpus: float, node: str, restarts: int) -> tuple[str, str]:
    """The pool keys of (the coordinator host, a client actor) of a run with these resources: the
    code, the role, and what fixes an actor's use (its CPUs and GPUs; the coordinator's node and
    restarts)."""
    digest = code_digest()
    return f"coordinator/{digest}/{node}/restarts={restarts}", f"client/{digest}/cpus={cpus:g}/gpus={gpus:g}"

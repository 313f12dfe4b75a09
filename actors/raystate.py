"""Every read of Ray's private state (`ray._private.state`: the GCS's actor and job tables and the
autoscaler's cluster config; `ray._raylet.GcsClient`, the client `ray.init` makes first), in one
place, so a Ray upgrade touches one file. The public State API
(`ray.util.state`) would need the dashboard, which a run may leave off. A read that fails (the GCS
busy or restarting) is unknown (None), never an answer: each caller says what unknown means.
`knock` and `cluster_gone` read no state: they ask whether a port (the head's GCS) takes connections."""

from __future__ import annotations

from typing import Any, Mapping

PENDING = ("PENDING_CREATION", "DEPENDENCIES_UNREADY")
"""An actor's states while it waits for resources (or its arguments) before Ray places it."""


def actor(actor_id: str) -> Mapping[str, Any] | None:
    """The GCS's record of an actor (hex id): `State`, `Pid`, `NumRestarts`, ... ({} for an actor
    the table does not hold); None when the read failed."""
    from ray._private import state

    try:
        return state.actors(actor_id) or {}
    except Exception:  # noqa: BLE001 - an internal table: any failure means "unknown"
        return None


def of(handle: Any) -> Mapping[str, Any] | None:
    """The GCS's record of the actor behind `handle` (None: unknown)."""
    return actor(handle._actor_id.hex())


def placed(handle: Any) -> bool | None:
    """Whether Ray has given the actor a worker process (its constructor may still be running);
    None: unknown (a busy GCS), which is neither placed nor waiting."""
    info = of(handle)
    return None if info is None else int(info.get("Pid", 0) or 0) > 0


def waiting(handle: Any) -> bool | None:
    """Whether the actor still waits to be placed (for resources, or its arguments); None: unknown."""
    info = of(handle)
    return None if info is None else info.get("State") in PENDING


def fresh(handle: Any) -> bool:
    """Whether the actor is known to be alive and never restarted (unknown: not fresh)."""
    info = of(handle) or {}
    return info.get("State") == "ALIVE" and int(info.get("NumRestarts", 0)) == 0


def running(actor_id: str) -> bool:
    """Whether the actor (hex id) has not died for good; unknown (a failed read) counts as running,
    so a busy GCS never ends a live borrower's lease."""
    info = actor(actor_id)
    return info is None or info.get("State") not in ("DEAD", None)


def live_jobs() -> set[str]:
    """The ids of the cluster's Ray jobs that have not ended."""
    from ray._private import state

    return {job["JobID"] for job in state.jobs() if not job["IsDead"]}


def max_resources() -> Mapping[str, float] | None:
    """The most an autoscaling cluster can grow to, by resource; None for a fixed-size cluster."""
    from ray._private import state

    return state.state.get_max_resources_from_cluster_config()


def gcs_error(address: str, timeout_s: float) -> BaseException | None:
    """What the GCS at `address` answers a key-value read with: None for an answer, else the error
    (an `AuthenticationError` for a token head this process has no token for, an RPC error or a
    timeout, by Ray's version)."""
    from ray._raylet import GcsClient

    try:
        GcsClient(address=address).internal_kv_get(b"rayfl-probe", namespace=None, timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - AuthenticationError, RpcError, or a timeout by version
        return exc
    return None


def knock(address: str, timeout_s: float) -> None:
    """Open and close one TCP connection to `address` (HOST:PORT; an IPv6 host with or without
    brackets) within `timeout_s`; `OSError` when none is made."""
    import socket

    host, _, port = address.rpartition(":")
    socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()


def cluster_gone(tries: int = 3, timeout_s: float = 2.0) -> bool:
    """Whether the head of the cluster this process joined is gone (`rayfl down`, a lost head
    node): its GCS port refused a connection, was unreachable or made none within `timeout_s`,
    `tries` times in a row, 1 s apart. A GCS that is only slow to answer (a loaded machine)
    still accepts connections, and a local failure (no free descriptor) is no answer: neither
    counts. Under Ray Client (`ray://`) the GCS may not be reachable from here: never gone."""
    import errno
    import time

    import ray

    if ray.util.client.ray.is_connected():
        return False
    gcs = ray.get_runtime_context().gcs_address
    for attempt in range(tries):
        time.sleep(1.0 if attempt else 0.0)
        try:
            knock(gcs, timeout_s)
            return False
        except (ConnectionError, TimeoutError):
            continue
        except OSError as exc:
            if exc.errno not in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN):
                return False
    return True


def kv_get(key: str, namespace: str) -> bytes | None:
    """The value the GCS's key-value store holds under `key` in `namespace`, None if none."""
    from ray.experimental import internal_kv

    return internal_kv._internal_kv_get(key, namespace=namespace)


def kv_put(key: str, value: bytes, namespace: str) -> None:
    """Store `value` under `key` in `namespace` of the GCS's key-value store: it outlives the
    process that wrote it, for as long as the cluster lives."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, namespace=namespace)


def named_actors(namespace: str, prefix: str) -> set[str] | None:
    """The names of the live named actors of `namespace` starting with `prefix`; None: unknown."""
    import ray

    try:
        return {
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == namespace and a["name"].startswith(prefix)
        }
    except Exception:  # noqa: BLE001 - the GCS busy or restarting
        return None

"""Which cluster a run joins, from the driver: an address given, `$RAY_ADDRESS`, the local head
`rayfl up` keeps (`head`), else a local cluster of its own; an address checked before `ray.init`
(`probe`: `ray.init` retries for minutes against an address where nothing answers, and prints a
line a second while it does; docs/faults.md), and a local cluster refused before it starts when
the run's actors could never fit it."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import Callable, Iterator

from ray.exceptions import AuthenticationError

from rayfl.config import ConfigError, RunConfig, shown

from .. import raystate
from .head import SYSTEM_CONFIG, joining

PROBE_S = 5.0
"""Seconds a cluster's address has to accept a connection, and then again to answer as a Ray head."""


def probe(address: str) -> None:
    """`ConfigError` (one line) unless `address` is a Ray head this process may join, found in
    seconds instead of `ray.init`'s minutes of retries: nothing accepts a connection there within
    `PROBE_S`, or it does not answer as a head's GCS, or the head uses token authentication and
    this process has no token for it (then the line says how to pass one). `auto` and `local`
    are left to Ray; a `ray://` address (Ray Client) is checked for a connection only."""
    if address in ("auto", "local"):
        return
    if address.startswith(("http://", "https://")):
        raise ConfigError(
            f"--address {shown(address, 80)}: a dashboard's address (rayfl submit takes it); rayfl run and tune take "
            "the head's GCS address, HOST:6379"
        )
    client = address.startswith("ray://")
    if not address.removeprefix("ray://").rpartition(":")[2].isdigit():
        raise ConfigError(f"--address {shown(address, 80)}: not HOST:PORT (e.g. 127.0.0.1:6379) or ray://HOST:PORT")
    try:
        raystate.knock(address.removeprefix("ray://"), PROBE_S)
    except OSError as exc:
        raise ConfigError(
            f"--address {shown(address, 80)}: nothing answers there ({exc.strerror or type(exc).__name__}); is the "
            "head up, and is this its GCS port (ray start --head --port, default 6379)?"
        ) from None
    if client:
        return
    answer: list[BaseException | None] = []  # the GCS client's C++ failures log lines of their own: silenced
    thread = threading.Thread(target=lambda: answer.append(raystate.gcs_error(address, PROBE_S)), daemon=True)
    with _silent_stderr(thread.is_alive):
        thread.start()
        thread.join(PROBE_S)
    error = answer[0] if answer else TimeoutError()
    if isinstance(error, AuthenticationError):
        raise ConfigError(
            f"--address {shown(address, 80)}: the cluster uses token authentication and this process has no valid "
            "token: "
            "export RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN=<the head's `ray get-auth-token`> unless "
            "~/.ray/auth_token holds it"
        )
    if error is not None:
        raise ConfigError(
            f"--address {shown(address, 80)}: accepts connections but does not answer as a Ray head's GCS within "
            f"{PROBE_S:g} s"
        )


@contextlib.contextmanager
def _silent_stderr(still_talking: Callable[[], bool]) -> Iterator[None]:
    """File descriptor 2 to /dev/null (Ray's C++ writes there directly), restored after; while
    `still_talking()` (a probe thread that outlived its wait and goes on logging), it stays
    there and Python's `sys.stderr` moves to a copy of the original, so rayfl's one line shows."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        if still_talking():
            sys.stderr = os.fdopen(saved, "w", buffering=1)
        else:
            os.dup2(saved, 2)
            os.close(saved)


def connect(address: str | None, dashboard: bool, verbose: bool = False) -> bool:
    """Join the running cluster (`head.joining`: `address`, $RAY_ADDRESS or the kept head; probed
    first), else start a local cluster sized to the machine (its workers at this process's
    priority, `head.SYSTEM_CONFIG`, none started idle, `OWN_CLUSTER`), with the dashboard on
    127.0.0.1 if asked; Ray's log lines
    and the workers' output only when `verbose`. Returns whether this call connected (and should
    disconnect)."""
    import ray

    if ray.is_initialized():
        return False
    quiet = dict(logging_level=logging.INFO if verbose else logging.ERROR, log_to_driver=verbose)  # rayfl's own lines
    address = joining(address)
    if address:
        probe(address)
        ray.init(address=address, **quiet)
    else:
        ray.init(
            address="local",
            include_dashboard=dashboard,
            dashboard_host="127.0.0.1",
            _system_config={**SYSTEM_CONFIG, **OWN_CLUSTER},
            **quiet,
        )
    return True


OWN_CLUSTER = {"prestart_worker_first_driver": False}
"""Ray's settings for a run's own local cluster besides `head.SYSTEM_CONFIG`: no idle worker
processes started for the driver (Ray starts one a CPU; each imports Ray, about 0.7 CPU seconds
measured on 2 cores). The run's actors start workers of their own: those workers only slowed
the rounds the driver runs while the actors come up."""


def here() -> dict[str, float]:
    """What a local cluster started here gets: this machine's CPUs and the GPUs torch sees
    (CUDA_VISIBLE_DEVICES respected, as Ray does)."""
    import torch

    return {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}


def check_fits_here(config: RunConfig) -> None:
    """Refuse a run whose actors a local cluster (`here`) cannot hold, before starting it. `auto`
    needs room for one actor."""
    resources = config.resources
    resources.check_fits(resources.fewest, here())

"""What the fault drills share: an action run in a thread once a run has written a file."""

import threading
import time
from pathlib import Path
from typing import Callable


def once_written(path: Path, action: Callable[[], None], timeout_s: float = 120) -> threading.Thread:
    """A started thread that waits (at most `timeout_s`) until `path` exists, then calls `action`;
    join it after the run."""

    def wait_then_act():
        deadline = time.time() + timeout_s
        while time.time() < deadline and not path.exists():
            time.sleep(0.05)
        action()

    thread = threading.Thread(target=wait_then_act)
    thread.start()
    return thread


def checkpoint_of(run_dir: Path, round: int) -> Path:
    return run_dir / "checkpoints" / f"round_{round:05d}.pt"


def actors_of(run_id: str, role: str) -> list:
    """The live run's actors in `role` (`coordinator`, `client`): its own, named after it, or
    those it borrowed from the warm pool (`actors/keeper.py`)."""
    import ray

    from actors.driver import pool

    own = [
        n["name"]
        for n in ray.util.list_named_actors(all_namespaces=True)
        if n["name"].startswith(f"rayfl:{run_id}:{role}")
    ]
    keeper = pool.keeper(create=False)
    leases = [] if keeper is None else ray.get(keeper.status.remote())["leased"]
    borrowed = [
        name
        for held in leases
        if held["run"] == run_id
        for name in held["actors"]
        if name.rsplit(":", 1)[-1].startswith(role)
    ]
    return [ray.get_actor(name, namespace="rayfl") for name in own + borrowed]


def holds_nothing(run_id: str) -> bool:
    """The run left no actor of its own and no lease in the pool."""
    return not actors_of(run_id, "coordinator") and not actors_of(run_id, "client")

"""What the fault drills share: an action run from a run's progress callback once a round has
been reported, or in a thread once a file is written."""

import subprocess
import sys
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


AHEAD = "ray.rounds_ahead=1"
"""The setting under which an `at_round` action at round r lands before the coordinator has
recorded round r + 2: while the run goes on, whatever the machine's load."""


def at_round(round: int, action: Callable[[], None]) -> Callable[[dict], None]:
    """A `progress` callback for `api.run` that calls `action` once, with the first row of round
    `round` or later, on the driver. Under `AHEAD` the coordinator records at most one round more
    until the callback has returned, so the action lands while the run goes on."""
    done: list[int] = []

    def progress(row: dict) -> None:
        if row["round"] >= round and not done:
            done.append(row["round"])
            action()

    return progress


def answering(actors: list, timeout_s: float = 300) -> None:
    """Block until every one of `actors` answers a call (one Ray is restarting is asked again)."""
    import ray
    from ray.exceptions import ActorUnavailableError

    deadline = time.time() + timeout_s
    for actor in actors:
        while True:
            try:
                ray.get(actor.info.remote(), timeout=timeout_s)
                break
            except ActorUnavailableError:
                assert time.time() < deadline, "a killed client actor did not come back"
                time.sleep(0.1)


def checkpoint_of(run_dir: Path, round: int) -> Path:
    return run_dir / "checkpoints" / f"round_{round:05d}.pt"


def a_long_run(run_dir: Path, env: dict[str, str]) -> subprocess.Popen:
    """`rayfl run` (the mlp, 100000 rounds, a checkpoint each round, its stderr piped) in `env`,
    returned once its first checkpoint is written (or it ended): a run going on for something to
    stop under it."""
    sets = ["model.name=mlp", "federation.rounds=100000", "federation.checkpoint_every=1"]
    args = [sys.executable, "-m", "rayfl", "run", *(a for s in sets for a in ("--set", s)), "--out", str(run_dir)]
    run = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    while not checkpoint_of(run_dir, 1).exists() and run.poll() is None:
        time.sleep(0.05)
    return run


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

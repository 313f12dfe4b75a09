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

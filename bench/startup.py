"""Where the fixed cost of a run goes: a short run in process, on a cold local cluster, on a warm
cluster with a cold pool, and on a warm pool, side by side.

Each run is a fresh process (`python -m rayfl run`-alike), timed from launch to exit:

- `--local`: in process, no Ray;
- cold local cluster: `rayfl run` starting (and stopping) its own local cluster and actors;
- warm cluster, cold pool: `rayfl run --address` on a head that is already up (started here by
  `rayfl up`'s code and stopped at the end, unless one was up already), its pool drained first;
- warm pool: the same run again, which borrows the actors the previous one handed back.

The Ray sides' breakdown comes from `rayfl.api.run(timings=...)`: imports (process start to the
call), building and checking the federation, starting or joining the cluster, starting or
borrowing and warming the actors, the rounds, and handing back or stopping.

    python bench/startup.py [--rounds 1] [--repeat 3] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = ["ray.dashboard=false"]
SIDES = {  # label -> (--one mode, needs the warm head)
    "in process (--local)": ("local", False),
    "cold local cluster": ("ray", False),
    "warm cluster, cold pool": ("address", True),
    "warm pool": ("address", True),
}


def one(mode: str, sets: list[str], address: str | None) -> dict:
    """One run in this process; the seconds of each phase."""
    started = time.perf_counter()
    from rayfl.loader import load_config

    config = load_config(None, sets)
    with tempfile.TemporaryDirectory() as out:
        if mode == "local":
            from rayfl.runner import run_local

            timings = {"imports": time.perf_counter() - started}
            begin = time.perf_counter()
            run_local(config, out)
            timings["run"] = time.perf_counter() - begin
            return timings
        from rayfl import api

        timings = {"imports": time.perf_counter() - started}
        api.run(config, out, address=address, timings=timings)
        return timings


def home_without_kept_head(folder: str) -> str:
    """A HOME in `folder` that links to every entry of this user's but `~/rayfl` (where the head
    `rayfl up` keeps is recorded): a run there starts its own local cluster, with the same token
    and caches as here."""
    home = Path(folder)
    home.mkdir(parents=True, exist_ok=True)
    for entry in Path.home().iterdir():
        if entry.name != "rayfl":
            (home / entry.name).symlink_to(entry)
    return str(home)


def timed(mode: str, sets: list[str], address: str | None, home: str) -> tuple[float, dict]:
    """A run in a fresh process; a cold local cluster's with a HOME where no kept head is recorded."""
    cmd = [sys.executable, __file__, "--one", mode, *[a for s in sets for a in ("--set", s)], *(["--address", address] if address else [])]
    env = {**os.environ, **({"HOME": home} if mode == "ray" else {})}
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return time.perf_counter() - start, json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the four runs; medians are printed")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--one", choices=["local", "ray", "address"], help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sets = [*BASE, f"federation.rounds={args.rounds}", *args.set]
    if args.one:
        print(json.dumps(one(args.one, sets, args.address)))
        return

    from actors import head

    was_up = head.kept() is not None
    record = head.up(num_cpus=os.cpu_count(), num_gpus=None, dashboard=False)
    head.joining(None)  # this process set up to join it (token authentication) before Ray's import

    import ray

    from actors import warm
    home = home_without_kept_head(f"{tempfile.mkdtemp()}/home")
    walls: dict[str, list[float]] = {side: [] for side in SIDES}
    parts: dict[str, list[dict]] = {side: [] for side in SIDES}
    try:
        for _ in range(args.repeat):
            for side, (mode, warm_head) in SIDES.items():
                if side == "warm cluster, cold pool":  # drained: the run starts its actors on the running head
                    ray.init(address=record["address"], logging_level="ERROR", log_to_driver=False)
                    print(warm.pool_command("drain"), file=sys.stderr)
                    ray.shutdown()
                    time.sleep(2.0)  # the drained actors' resources come back
                wall, timings = timed(mode, sets, record["address"] if warm_head else None, home)
                walls[side].append(wall)
                parts[side].append(timings)
    finally:
        if not was_up:
            head.down()
    phases = ["imports", "build", "ray_start", "actors", "rounds", "shutdown"]
    print(f"{args.rounds}-round run of the default federation{' ' + ' '.join(args.set) if args.set else ''} (dashboard off); medians of {args.repeat}, seconds")
    print(f"| run | process wall | over --local | {' | '.join(phases)} |")
    print(f"|---|---|---|{'---|' * len(phases)}")
    local = statistics.median(walls["in process (--local)"])
    for side in SIDES:
        wall = statistics.median(walls[side])
        named = [{**p, "rounds": p.get("rounds", p.get("run"))} for p in parts[side]]  # in process: its whole run under rounds
        cells = [f"{statistics.median(p[k] for p in named):.2f}" if k in named[0] else "-" for k in phases]
        print(f"| {side} | {wall:.2f} | {wall - local:+.2f} | {' | '.join(cells)} |")

if __name__ == "__main__":
    main()

"""Where the fixed cost of a run on Ray goes: a 1-round run on Ray against the same in process.

Each side runs in a fresh process, timed from launch to exit. The Ray side's breakdown comes
from `rayfl.api.run(timings=...)`: imports (process start to the call), building and checking
the federation, starting the local Ray cluster, starting and warming the client actors (and the
coordinator beside them), the round itself, and shutting down.

    python bench/startup.py [--rounds 1] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

BASE = ["federation.rounds=1", "ray.dashboard=false"]


def one(on_ray: bool, sets: list[str]) -> dict:
    """One run in this process; the seconds of each phase."""
    started = time.perf_counter()
    from rayfl.loader import load_config

    config = load_config(None, sets)
    with tempfile.TemporaryDirectory() as out:
        if on_ray:
            from rayfl import api

            timings: dict[str, float] = {"imports": time.perf_counter() - started}
            api.run(config, out, timings=timings)
            return timings
        from rayfl.runner import run_local

        timings = {"imports": time.perf_counter() - started}
        begin = time.perf_counter()
        run_local(config, out)
        timings["run"] = time.perf_counter() - begin
        return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--one", choices=["ray", "local"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    sets = [*BASE, f"federation.rounds={args.rounds}", *args.set]
    if args.one:
        print(json.dumps(one(args.one == "ray", sets)))
        return
    walls, parts = {}, {}
    for side in ("local", "ray"):
        cmd = [sys.executable, __file__, "--one", side, "--rounds", str(args.rounds), *[a for s in args.set for a in ("--set", s)]]
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        walls[side] = time.perf_counter() - start
        parts[side] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{args.rounds}-round run of the default federation{' ' + ' '.join(args.set) if args.set else ''} (dashboard off)")
    print(f"in process: {walls['local']:.1f} s wall (imports {parts['local']['imports']:.1f} s, run {parts['local']['run']:.1f} s)")
    ray_parts = parts["ray"]
    listed = ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in ray_parts.items())
    print(f"on Ray:     {walls['ray']:.1f} s wall ({listed})")
    print(f"Ray costs {walls['ray'] - walls['local']:+.1f} s over in process")


if __name__ == "__main__":
    main()

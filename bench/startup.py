"""Where the fixed cost of a run goes: a short run in process, on a cold local cluster, on a warm
cluster with a cold pool, and on a warm pool, side by side.

Each run is a fresh process (`python -m rayfl run`-alike), timed from launch to exit:

- `--local`: in process, no Ray;
- cold local cluster: `rayfl run` starting (and stopping) its own local cluster and actors,
  its rounds begun in process meanwhile (`ray.start_in_process: auto`), and the same waiting for
  them (`false`, as before 2026-11-27);
- warm cluster, cold pool: `rayfl run --address` on a head that is already up (started here by
  `rayfl up`'s code and stopped at the end), its pool drained first;
- warm pool: the same run again, which borrows the actors the previous one handed back.

The first two alternate before the head starts (its idle processes would slow a cold start on a
small machine), the others after it, with `--local` again beside the head; each "over --local"
is against the `--local` runs of its own phase.

The Ray sides' breakdown comes from `rayfl.api.run(timings=...)`: imports (process start to the
call), building and checking the federation, the rounds begun in process (until the run moved
or ended), starting or joining the cluster, starting or borrowing and warming the actors (the
rounds begun in process overlap both), the rounds on the actors, and handing back or stopping.

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

BASE = ["ray.dashboard=false"]
SIDES = {  # label -> (--one mode, measured while the warm head is up, its own settings)
    "in process (--local)": ("local", False, []),
    "cold local cluster": ("ray", False, []),
    "cold local cluster, waiting for Ray": ("ray", False, ["ray.start_in_process=false"]),
    "in process, beside the warm head": ("local", True, []),
    "warm cluster, cold pool": ("ray", True, []),
    "warm pool": ("ray", True, []),
}


def one(mode: str, sets: list[str], address: str | None) -> dict:
    """One run in this process; the seconds of each phase."""
    started = time.perf_counter()
    from rayfl.load import load_config

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


def timed(mode: str, sets: list[str], address: str | None) -> tuple[float, dict]:
    """A run in a fresh process."""
    cmd = [
        sys.executable,
        __file__,
        "--one",
        mode,
        *[a for s in sets for a in ("--set", s)],
        *(["--address", address] if address else []),
    ]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="times each run is measured; medians are printed")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--one", choices=["local", "ray"], help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sets = [*BASE, f"federation.rounds={args.rounds}", *args.set]
    if args.one:
        print(json.dumps(one(args.one, sets, args.address)))
        return

    from actors.driver import head

    if head.kept() is not None:
        sys.exit(
            "bench/startup.py: a head rayfl up keeps is running; rayfl down first (its processes would slow the cold "
            "runs)"
        )
    walls: dict[str, list[float]] = {side: [] for side in SIDES}
    parts: dict[str, list[dict]] = {side: [] for side in SIDES}

    def measure(side: str, address: str | None) -> None:
        wall, timings = timed(SIDES[side][0], [*sets, *SIDES[side][2]], address)
        walls[side].append(wall)
        parts[side].append(timings)

    for _ in range(args.repeat):  # no other cluster on the machine
        measure("in process (--local)", None)
        measure("cold local cluster", None)
        measure("cold local cluster, waiting for Ray", None)
    record = head.up(num_cpus=os.cpu_count(), num_gpus=None, dashboard=False)
    head.joining(None)  # this process set up to join it (token authentication) before Ray's import
    import ray

    from actors.driver import pool

    try:
        for _ in range(args.repeat):
            ray.init(address=record["address"], logging_level="ERROR", log_to_driver=False)
            print(pool.pool_command("drain"), file=sys.stderr)  # the next run starts its actors on the running head
            ray.shutdown()
            time.sleep(2.0)  # the drained actors' resources come back
            measure("warm cluster, cold pool", record["address"])
            measure("warm pool", record["address"])
            measure("in process, beside the warm head", None)
    finally:
        head.down()
    phases = ["imports", "build", "in_process", "ray_start", "actors", "rounds", "shutdown"]
    print(
        f"{args.rounds}-round run of the default federation{' ' + ' '.join(args.set) if args.set else ''} (dashboard "
        f"off); medians of {args.repeat}, seconds"
    )
    print(f"| run | process wall | over --local | {' | '.join(phases)} |")
    print(f"|---|---|---|{'---|' * len(phases)}")
    for side in SIDES:
        wall = statistics.median(walls[side])
        local = statistics.median(
            walls["in process (--local)" if not SIDES[side][1] else "in process, beside the warm head"]
        )
        named = [
            {**p, "rounds": p.get("rounds", p.get("run", 0.0))} for p in parts[side]
        ]  # in process: its whole run under rounds; a run that never moved: none on the actors
        cells = [f"{statistics.median(p[k] for p in named):.2f}" if k in named[0] else "-" for k in phases]
        print(f"| {side} | {wall:.2f} | {wall - local:+.2f} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

"""Setup time, per-round time and peak memory against the number of logical clients.

For each N it runs a fresh process: FedAvg (or `--algorithm`) on `synthetic` (each client generated from its own
key, an MLP) and on `digits` with a lazily drawn Dirichlet(0.5) partition (`sampled`, 50
samples a client), 10 clients a round, 4 rounds, in process. It prints the setup time (from
loading the config to the first round's start: building the federation and, on Ray, starting
the cluster and the actors), the mean time of rounds 2-4 (from the run's `wall_time_s`), and the
peak RSS of the largest process of the whole tree (with `--ray`: driver, coordinator, client
actors and Ray's own processes; the driver's and actors' as sampled every 0.2 s).

With `--devices diurnal` the clients are online 30% of the day in sessions (docs/devices.md) and
half of them arrive over the run, one a second.

An algorithm that works over every client (`Algorithm.over_every_client`: HeteroFL, FeDepth,
DepthFL, InclusiveFL, split learning) refuses a population past its bound before it starts; its
row then says so.

    python bench/scale.py [--clients 1e3 1e4 1e5 1e6 1e7] [--data synthetic digits] [--ray] [--devices static|diurnal]
                          [--algorithm fedavg] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

DATA = {
    "synthetic": ["data.name=synthetic", "model.name=mlp"],
    "digits": ["data.partition={kind: sampled, mix: dirichlet, alpha: 0.5, size: 50}", "model.name=mlp"],
}
ROUNDS = 4
DEVICES = {  # --devices: who is there and online
    "static": [],
    # online 30% of the day in 30-minute sessions; half the clients at the start, one arriving every second
    "diurnal": [
        "devices.availability.kind=diurnal",
        "devices.population.arrivals_per_hour=3600",
        "devices.population.initial=HALF",
    ],
}


def one(data: str, n: int, on_ray: bool, devices: str, algorithm: str, extra: list[str]) -> dict:
    """One point, in this process (run by the parent in a fresh interpreter)."""
    import resource
    import tempfile

    import numpy as np
    import pandas as pd
    import psutil

    from rayfl.load import load_config

    sets = [
        f"algorithm.name={algorithm}",
        *DATA[data],
        f"data.num_clients={n}",
        f"federation.rounds={ROUNDS}",
        "federation.checkpoint_every=0",
        "ray.num_actors=2",
        "ray.dashboard=false",
        *extra,
    ]
    sets += [s.replace("HALF", str(n // 2)) for s in DEVICES[devices]]
    start = time.perf_counter()
    config = load_config(None, sets)
    first: list[float] = []

    def progress(row):
        if not first:  # the first round's row: when the rounds started, on this process's clock
            first.append(time.perf_counter() - row["wall_time_s"])

    peak = {"rss": 0}
    stop = threading.Event()

    def watch():  # the largest process of this tree, sampled every 0.2 s
        me = psutil.Process()
        while not stop.is_set():
            for p in [me, *me.children(recursive=True)]:
                try:
                    peak["rss"] = max(peak["rss"], p.memory_info().rss)
                except psutil.Error:
                    pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with tempfile.TemporaryDirectory() as out:
        if on_ray:
            from rayfl import api

            api.run(config, out, progress=progress)
        else:
            from rayfl.runner import run_local

            run_local(config, out, progress=progress)
        wall = pd.read_parquet(f"{out}/metrics.parquet")["wall_time_s"].to_numpy()
    stop.set()
    return {
        "data": data,
        "clients": n,
        "setup_s": first[0] - start,
        "round_s": float(np.diff(wall)[1:].mean()),
        "peak_rss_mb": max(peak["rss"], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="+", type=float, default=[1e3, 1e4, 1e5, 1e6, 1e7])
    parser.add_argument("--data", nargs="+", choices=sorted(DATA), default=sorted(DATA, reverse=True))
    parser.add_argument("--ray", action="store_true", help="run on Ray (2 client actors) instead of in process")
    parser.add_argument(
        "--devices",
        choices=sorted(DEVICES),
        default="static",
        help="diurnal: diurnal availability and arrivals (docs/devices.md)",
    )
    parser.add_argument("--algorithm", default="fedavg", help="the algorithm to run (default fedavg)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more config overrides")
    parser.add_argument("--one", nargs=2, metavar=("DATA", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(float(args.one[1])), args.ray, args.devices, args.algorithm, args.set)))
        return
    print(
        f"{args.algorithm}, MLP, 10 clients a round, {ROUNDS} rounds, "
        f"{'on Ray (2 client actors)' if args.ray else 'in process'}, devices {args.devices}; round = mean of rounds "
        f"2-{ROUNDS}"
    )
    print("| data | logical clients | setup s | per round s | peak RSS MB (largest process) |")
    print("|---|---|---|---|---|")
    for data in args.data:
        base = None
        for n in args.clients:
            cmd = [
                sys.executable,
                __file__,
                "--one",
                data,
                str(int(n)),
                "--devices",
                args.devices,
                "--algorithm",
                args.algorithm,
                *(f"--set={kv}" for kv in args.set),
                *(["--ray"] if args.ray else []),
            ]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["killed"])[-1]
                said = last.split("ConfigError: ", 1)[-1] if "ConfigError: " in last else f"stopped: {last}"
                print(f"| {data} | {int(n):,} | {said[:200]} | | |")
                break
            r = json.loads(done.stdout.strip().splitlines()[-1])
            base = base or r["round_s"]
            print(
                f"| {data} | {int(n):,} | {r['setup_s']:.1f} | {r['round_s']:.3f} ({r['round_s'] / base:.2f}x) | "
                f"{r['peak_rss_mb']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""A sweep of short runs: a `rayfl tune` experiment of 20 trials x 3 rounds with warm actors
against the same with a fresh set of actors per trial, side by side.

The experiment: the default federation (digits, FedAvg), 3 rounds a trial, a grid of 20
learning rates, 2 trials at a time, no scheduler. It runs twice, each as a fresh `rayfl tune`
process (which starts its own local cluster), timed from launch to exit:

- warm (the default, `ray.pool_idle_s` > 0): trials borrow their coordinator host and client
  actors from the cluster's pool and hand them back for the next trial; Tune reuses each trial's
  process (`reuse_actors`);
- per trial (`ray.pool_idle_s: 0`, the design before warm pools): every trial starts its own
  actors inside its placement group, and Tune a new process for it.

Prints both wall times, their ratio, and the best trial of each (the same trial, the same accuracy).

    python bench/tune_sweep.py [--trials 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    lrs = [float(f"{x:.4g}") for x in np.geomspace(0.005, 0.5, args.trials)]
    walls, bests = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, pool in (("warm actors", []), ("actors per trial", ["--set", "ray.pool_idle_s=0"])):
            spec = Path(tmp) / f"{'warm' if not pool else 'fresh'}.yaml"
            spec.write_text(
                yaml.safe_dump(
                    {
                        "base": {"federation": {"rounds": args.rounds}, "ray": {"dashboard": False}},
                        "search": {"federation.lr": {"grid": lrs}},
                        "metric": "test_accuracy",
                        "max_concurrent_trials": 2,
                        "scheduler": {"name": "none"},
                        "storage": f"{tmp}/runs",
                    }
                )
            )
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "rayfl", "tune", str(spec), *pool], check=True, capture_output=True, text=True
            )
            walls[label] = time.perf_counter() - start
            table = pd.read_csv(Path(tmp) / "runs" / spec.stem / "results.csv")
            best = table.loc[table["final_test_accuracy"].idxmax()]
            bests[label] = (best["federation.lr"], best["final_test_accuracy"], (table["status"] == "finished").sum())
    print(
        f"rayfl tune: default federation, {args.trials} trials x {args.rounds} rounds (grid of learning rates), 2 at "
        "a time, fresh local cluster"
    )
    print("| actors | process wall s | ratio | trials finished | best lr | best accuracy |")
    print("|---|---|---|---|---|---|")
    base = walls["actors per trial"]
    for label, wall in walls.items():
        lr, acc, done = bests[label]
        print(f"| {label} | {wall:.1f} | {wall / base:.2f}x | {done} | {lr:g} | {acc:.4f} |")
    print(f"warm actors: {base / walls['warm actors']:.2f}x faster")


if __name__ == "__main__":
    main()

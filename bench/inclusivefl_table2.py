"""InclusiveFL against the baselines of its Table 2 on digits or MNIST-1D, over several seeds.

Runs examples/inclusivefl/{inclusivefl,without_md,alllarge,allsmall,exclusivefl,heterofl}.yaml
in-process, --procs at a time (default 2), for --seeds seeds, and prints per run, as mean +- standard deviation
over the seeds: the final accuracy of the largest (global) model (mean of the last 5 rounds), its
best accuracy, the final accuracy of the model each device group deploys (weak / medium /
strong: InclusiveFL's sub-global models, HeteroFL's levels c / b / a, AllSmall's one model for
all, AllLarge's and ExclusiveFL's for the strong group only), and the rounds InclusiveFL and its
w/o-MD run take to reach the w/o-MD run's best accuracy (Table 4's direction). `--data mnist1d`
swaps the dataset; `--set KEY=VALUE` applies to every run. With --runs DIR the runs are kept
there and `rayfl compare`'s table and plots of them are written into DIR/compare.

    python bench/inclusivefl_table2.py [--data digits] [--seeds 3] [--procs 2] [--set KEY=VALUE ...] [--runs DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = {
    "InclusiveFL": "inclusivefl",
    "InclusiveFL w/o MD": "without_md",
    "AllLarge": "alllarge",
    "AllSmall": "allsmall",
    "ExclusiveFL": "exclusivefl",
    "HeteroFL (equal params)": "heterofl",
}
GROUPS = ("weak", "medium", "strong")
DEPLOYED = {  # the metric column of the model each group deploys
    "InclusiveFL": {g: f"test_accuracy@{g}" for g in GROUPS},
    "InclusiveFL w/o MD": {g: f"test_accuracy@{g}" for g in GROUPS},
    "HeteroFL (equal params)": {"weak": "test_accuracy@c", "medium": "test_accuracy@b", "strong": "test_accuracy@a"},
    "AllSmall": dict.fromkeys(GROUPS, "test_accuracy"),
    "AllLarge": {"strong": "test_accuracy"},
    "ExclusiveFL": {"strong": "test_accuracy"},
}


def one(job: tuple[str, int, list[str], str]) -> dict:
    import pandas as pd

    from rayfl.load import load_config
    from rayfl.runner import run_local

    label, seed, sets, out = job
    run_local(load_config(ROOT / "examples" / "inclusivefl" / f"{RUNS[label]}.yaml", [*sets, f"seed={seed}"]), out)
    m = pd.read_parquet(Path(out) / "metrics.parquet")
    return {
        "run": label,
        "seed": seed,
        "accuracy": m["test_accuracy"].tolist(),
        "final": float(m["test_accuracy"].tail(5).mean()),
        "best": float(m["test_accuracy"].max()),
        "groups": {g: float(m[col].tail(5).mean()) for g, col in DEPLOYED[label].items()},
    }


def rounds_to(accuracy: list[float], target: float) -> int | None:
    return next((i + 1 for i, a in enumerate(accuracy) if a >= target), None)


def spread(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.4f} +- {statistics.stdev(xs):.4f}" if len(xs) > 1 else f"{xs[0]:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=["digits", "mnist1d"], default="digits")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument("--procs", type=int, default=2, help="runs at a time, one process (and one torch thread) each")
    parser.add_argument(
        "--runs", default=None, help="keep the runs here; rayfl compare's table and plots go to RUNS/compare"
    )
    args = parser.parse_args()
    sets = [f"data.name={args.data}", *args.set]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [
            (label, seed, sets, f"{args.runs or tmp}/{seed}-{RUNS[label]}")
            for seed in range(args.seeds)
            for label in RUNS
        ]
        with ProcessPoolExecutor(args.procs) as pool:
            rows = list(pool.map(one, jobs))
        if args.runs:
            from rayfl.compare import compare

            compare([j[3] for j in jobs], Path(args.runs) / "compare", last=5)
    print(
        f"{args.data}, examples/inclusivefl, seeds 0..{args.seeds - 1} {' '.join(args.set)}; final = mean of the "
        "last 5 rounds, mean +- sd over seeds"
    )
    print("| run | final accuracy | best accuracy | weak | medium | strong |")
    print("|---|---|---|---|---|---|")
    for label in RUNS:
        rs = [r for r in rows if r["run"] == label]
        groups = [spread([r["groups"][g] for r in rs]) if g in rs[0]["groups"] else "-" for g in GROUPS]
        print(
            f"| {label} | {spread([r['final'] for r in rs])} | {spread([r['best'] for r in rs])} | "
            f"{' | '.join(groups)} |"
        )
    print("rounds to the w/o-MD run's best accuracy (per seed):")
    for seed in range(args.seeds):
        by = {r["run"]: r for r in rows if r["seed"] == seed}
        target = by["InclusiveFL w/o MD"]["best"]
        print(
            f"  seed {seed}: target {target:.4f}: InclusiveFL {rounds_to(by['InclusiveFL']['accuracy'], target)}, "
            f"w/o MD {rounds_to(by['InclusiveFL w/o MD']['accuracy'], target)}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

"""FedSup and E-FedSup against the baselines of their Table 2 on shards, over seeds.

Runs examples/fedsup/{fedsup,efedsup,fedavg,localonly,lgfedavg,ditto,perfedavg}.yaml in-process,
--procs at a time (default 2), for --seeds seeds, and prints, as mean +- standard deviation over
the seeds, each run's initial accuracy (the model as sent, on each client's own test data,
averaged over clients), personalized accuracy (FedSup, E-FedSup, FedAvg: the head fine-tuned
per client; Local-only, LG-FedAvg, Ditto, Per-FedAvg: their own personal models), the mean over
clients of the standard deviation across clients, and the global test accuracy with FedSup's Big /
Medium / Small children. `--set KEY=VALUE` applies to every run (e.g.
data.partition.classes_per_client=5 for the paper's s = 50, federation.clients_per_round=20 for R = 1);
`--runs` picks some of the methods, or the steps between FedSup and E-FedSup (`GAP`); `--out
DIR` keeps the runs (and a rerun reuses the finished ones: the same --set, or the figures mix
settings). With `--curves FILE`, draws the children's test accuracy over the rounds (mean over
seeds, each seed faint) for the supernet runs.

    python bench/fedsup_table2.py [--seeds 3] [--procs 2] [--runs FedSup E-FedSup] [--set KEY=VALUE ...]
                                  [--out DIR] [--curves curves.png]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = {
    "Local-only": ("localonly", []),
    "FedAvg": ("fedavg", []),
    "Ditto": ("ditto", []),
    "LG-FedAvg": ("lgfedavg", []),
    "Per-FedAvg": ("perfedavg", []),
    "FedSup": ("fedsup", []),
    "E-FedSup": ("efedsup", []),
}
"""Table 2's methods: label -> (example file, its own overrides)."""
GAP = {
    "FedSup M=1": ("fedsup", ["algorithm.subnets=1"]),  # no sandwich, no distillation: one random sub-net a step
    "E-FedSup whole space": ("efedsup", ["algorithm.tier_budgets=[1.0,1.0,1.0]"]),  # every tier draws from all
    "E-FedSup whole space, count": ("efedsup", ["algorithm.tier_budgets=[1.0,1.0,1.0]", "algorithm.aggregation=count"]),
}
"""The steps between FedSup and E-FedSup (docs/fedsup.md, "E-FedSup's gap"): each changes one
thing of its neighbour's."""
METHODS = {**RUNS, **GAP}
CHILDREN = ["test_accuracy@big", "test_accuracy@medium", "test_accuracy@small"]
COLUMNS = [
    "initial_accuracy",
    "initial_accuracy_std",
    "personal_accuracy",
    "personal_accuracy_std",
    "test_accuracy",
    *CHILDREN,
]


def one(job: tuple[str, int, list[str], str]) -> dict:
    import pandas as pd

    from rayfl.load import load_config
    from rayfl.runner import run_local

    label, seed, sets, out = job
    example, own = METHODS[label]
    if not (Path(out) / "summary.json").is_file():  # a finished run is kept (--out): rerun only what is missing
        run_local(load_config(ROOT / "examples" / "fedsup" / f"{example}.yaml", [*own, *sets, f"seed={seed}"]), out)
    metrics = pd.read_parquet(Path(out) / "metrics.parquet")
    last = metrics.iloc[-1]
    evaluated = metrics.dropna(subset=["test_accuracy"])
    curves = {c: evaluated[c].tolist() for c in CHILDREN if c in evaluated}
    return {
        "run": label,
        "seed": seed,
        **{c: float(last[c]) if c in last else math.nan for c in COLUMNS},
        "rounds": evaluated["round"].tolist(),
        "curves": curves,
    }


def draw(rows: list[dict], path: str) -> None:
    """Each supernet run's children over the rounds: the mean over seeds, each seed faint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [label for label in METHODS if any(r["run"] == label and r["curves"] for r in rows)]
    cols = min(2, len(runs))  # two panels a row: readable at a page's width
    grid = (math.ceil(len(runs) / cols), cols)
    fig, axes = plt.subplots(*grid, figsize=(5 * cols, 3.6 * grid[0]), sharey=True, squeeze=False)
    for ax in axes.flat[len(runs) :]:
        ax.set_visible(False)
    for ax, label in zip(axes.flat, runs):
        rs = [r for r in rows if r["run"] == label]
        for child, colour in zip(CHILDREN, ("C0", "C1", "C2")):
            for r in rs:
                ax.plot(r["rounds"], r["curves"][child], color=colour, alpha=0.25, lw=0.8)
            ax.plot(
                rs[0]["rounds"],
                [statistics.mean(v) for v in zip(*(r["curves"][child] for r in rs))],
                color=colour,
                label=child.split("@")[1],
            )
        ax.set_title(label)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("test accuracy")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def slug(label: str) -> str:
    """A method's folder name: its example file, and the gap step's own label."""
    example, own = METHODS[label]
    return example if not own else f"{example}-{label.split(' ', 1)[1].replace(' ', '').replace(',', '-')}"


def spread(xs: list[float]) -> str:
    if all(math.isnan(x) for x in xs):
        return "-"
    return f"{statistics.mean(xs):.4f} +- {statistics.stdev(xs):.4f}" if len(xs) > 1 else f"{xs[0]:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument("--procs", type=int, default=2, help="runs at a time, one process (and one torch thread) each")
    parser.add_argument(
        "--runs",
        nargs="+",
        choices=list(METHODS),
        default=list(RUNS),
        help="the methods to run (default: Table 2's; also the steps of E-FedSup's gap)",
    )
    parser.add_argument("--curves", help="draw the supernet runs' children over the rounds to this image")
    parser.add_argument(
        "--out", help="keep the runs in this folder (OUT/SEED-ALGORITHM), and reuse those finished there"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [
            (label, seed, args.set, f"{args.out or tmp}/{seed}-{slug(label)}")
            for seed in range(args.seeds)
            for label in args.runs
        ]
        with ProcessPoolExecutor(args.procs) as pool:
            rows = list(pool.map(one, jobs))
    print(f"examples/fedsup, seeds 0..{args.seeds - 1} {' '.join(args.set)}; the last round, mean +- sd over seeds")
    print(
        "| run | initial | personalized | sd over clients (initial / personalized) | global test accuracy | Big / "
        "Medium / Small |"
    )
    print("|---|---|---|---|---|---|")
    for label in args.runs:
        rs = [r for r in rows if r["run"] == label]
        col = lambda c: [r[c] for r in rs]
        sd = " / ".join(
            "-" if math.isnan(m := statistics.mean(col(c))) else f"{m:.3f}"
            for c in ("initial_accuracy_std", "personal_accuracy_std")
        )
        children = (
            " / ".join(f"{statistics.mean(col(f'test_accuracy@{c}')):.4f}" for c in ("big", "medium", "small"))
            if not math.isnan(rs[0]["test_accuracy@big"])
            else "-"
        )
        print(
            f"| {label} | {spread(col('initial_accuracy'))} | {spread(col('personal_accuracy'))} | {sd} | "
            f"{spread(col('test_accuracy'))} | {children} |"
        )
    print(json.dumps(rows))
    if args.curves:
        draw(rows, args.curves)


if __name__ == "__main__":
    main()

"""FedSup and E-FedSup against the baselines of their Table 2 on shards, over seeds.

Runs examples/fedsup/{fedsup,efedsup,fedavg,localonly,lgfedavg,ditto,perfedavg}.yaml in-process,
--procs at a time (default 2), for --seeds seeds, and prints, as mean +- standard deviation over
the seeds, each run's initial accuracy (the model as sent, on each client's own test data,
averaged over clients), personalized accuracy (FedSup, E-FedSup, FedAvg: the head fine-tuned
per client; Local-only, LG-FedAvg, Ditto, Per-FedAvg: their own personal models), the mean over
clients of the standard deviation across clients, and the global test accuracy with FedSup's Big /
Medium / Small children. `--set KEY=VALUE` applies to every run (e.g.
data.partition.classes_per_client=5 for the paper's s = 50, federation.clients_per_round=20 for R = 1).

    python bench/fedsup_table2.py [--seeds 3] [--procs 2] [--set KEY=VALUE ...]
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
RUNS = {"Local-only": "localonly", "FedAvg": "fedavg", "Ditto": "ditto", "LG-FedAvg": "lgfedavg", "Per-FedAvg": "perfedavg", "FedSup": "fedsup", "E-FedSup": "efedsup"}
COLUMNS = ["initial_accuracy", "initial_accuracy_std", "personal_accuracy", "personal_accuracy_std", "test_accuracy", "test_accuracy@big", "test_accuracy@medium", "test_accuracy@small"]


def one(job: tuple[str, int, list[str], str]) -> dict:
    import pandas as pd

    from rayfl.loader import load_config
    from rayfl.runner import run_local

    label, seed, sets, out = job
    run_local(load_config(ROOT / "examples" / "fedsup" / f"{RUNS[label]}.yaml", [*sets, f"seed={seed}"]), out)
    last = pd.read_parquet(Path(out) / "metrics.parquet").iloc[-1]
    return {"run": label, "seed": seed, **{c: float(last[c]) if c in last else math.nan for c in COLUMNS}}


def spread(xs: list[float]) -> str:
    if all(math.isnan(x) for x in xs):
        return "-"
    return f"{statistics.mean(xs):.4f} +- {statistics.stdev(xs):.4f}" if len(xs) > 1 else f"{xs[0]:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument("--procs", type=int, default=2, help="runs at a time, one process (and one torch thread) each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(label, seed, args.set, f"{tmp}/{seed}-{RUNS[label]}") for seed in range(args.seeds) for label in RUNS]
        with ProcessPoolExecutor(args.procs) as pool:
            rows = list(pool.map(one, jobs))
    print(f"examples/fedsup, seeds 0..{args.seeds - 1} {' '.join(args.set)}; the last round, mean +- sd over seeds")
    print("| run | initial | personalized | sd over clients (initial / personalized) | global test accuracy | Big / Medium / Small |")
    print("|---|---|---|---|---|---|")
    for label in RUNS:
        rs = [r for r in rows if r["run"] == label]
        col = lambda c: [r[c] for r in rs]  # noqa: E731
        sd = f"{statistics.mean(col('initial_accuracy_std')):.3f} / {statistics.mean(col('personal_accuracy_std')):.3f}"
        children = " / ".join(f"{statistics.mean(col(f'test_accuracy@{c}')):.4f}" for c in ("big", "medium", "small")) if not math.isnan(rs[0]["test_accuracy@big"]) else "-"
        print(f"| {label} | {spread(col('initial_accuracy'))} | {spread(col('personal_accuracy'))} | {sd} | {spread(col('test_accuracy'))} | {children} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

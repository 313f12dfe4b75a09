"""FeDepth against the baselines of its Table 2 under the Fair, Lack and Surplus budgets, over seeds.

Runs examples/fedepth/{fedavg_min,heterofl,splitmix,depthfl,fedepth,mfedepth}.yaml in-process,
--procs at a time (default 2), for --seeds seeds, under each scenario's device profile
(fedepth_fair / fedepth_lack / fedepth_surplus; FedAvg at the scenario's smallest width, and
only the FeDepth family under Surplus, as the paper's table), and prints per scenario and run
the final accuracy of the global model (mean of the last 5 rounds) and its best, as mean +-
standard deviation over the seeds, and the clients that never fit a plan. `--set KEY=VALUE`
applies to every run (e.g. data.name=mnist1d).

    python bench/fedepth_table2.py [--scenarios fair lack surplus] [--seeds 3] [--procs 2] [--set KEY=VALUE ...]
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
    "FedAvg (x min r)": "fedavg_min",
    "HeteroFL": "heterofl",
    "SplitMix": "splitmix",
    "DepthFL": "depthfl",
    "FeDepth": "fedepth",
    "m-FeDepth": "mfedepth",
}
SCENARIOS = {
    "fair": (list(RUNS), ["model.rate=0.16666666666666666"]),
    "lack": (list(RUNS), ["model.rate=0.125"]),
    "surplus": (["FeDepth", "m-FeDepth"], []),
}


def one(job: tuple[str, str, int, list[str], str]) -> dict:
    import pandas as pd

    from rayfl.load import load_config
    from rayfl.runner import run_local

    scenario, label, seed, sets, out = job
    extra = SCENARIOS[scenario][1] if RUNS[label] == "fedavg_min" else []
    summary = run_local(
        load_config(
            ROOT / "examples" / "fedepth" / f"{RUNS[label]}.yaml",
            [f"devices.profile=fedepth_{scenario}", *extra, *sets, f"seed={seed}"],
        ),
        out,
    )
    m = pd.read_parquet(Path(out) / "metrics.parquet")
    c = pd.read_parquet(Path(out) / "clients.parquet")
    return {
        "scenario": scenario,
        "run": label,
        "seed": seed,
        "final": float(m["test_accuracy"].tail(5).mean()),
        "best": float(m["test_accuracy"].max()),
        "clients_trained": int(c.loc[c["status"] == "ok", "client_id"].nunique()),
        "virtual_time_s": float(summary["virtual_time_s"]),
    }


def spread(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.4f} +- {statistics.stdev(xs):.4f}" if len(xs) > 1 else f"{xs[0]:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument("--procs", type=int, default=2, help="runs at a time, one process (and one torch thread) each")
    parser.add_argument(
        "--plots", type=Path, metavar="DIR", help="each scenario's seed-0 accuracy plots, DIR/<scenario>"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [
            (s, label, seed, args.set, f"{tmp}/{s}-{seed}-{RUNS[label]}")
            for s in args.scenarios
            for seed in range(args.seeds)
            for label in SCENARIOS[s][0]
        ]
        with ProcessPoolExecutor(args.procs) as pool:
            rows = list(pool.map(one, jobs))
        if args.plots:
            from rayfl.compare import compare

            for s in args.scenarios:
                compare([f"{tmp}/{s}-0-{RUNS[label]}" for label in SCENARIOS[s][0]], args.plots / s)
    print(
        f"examples/fedepth, seeds 0..{args.seeds - 1} {' '.join(args.set)}; final = mean of the last 5 rounds, mean "
        "+- sd over seeds"
    )
    print("| budgets | run | final accuracy | best accuracy | clients that trained | virtual time (s) |")
    print("|---|---|---|---|---|---|")
    for s in args.scenarios:
        for label in SCENARIOS[s][0]:
            rs = [r for r in rows if r["scenario"] == s and r["run"] == label]
            print(
                f"| {s} | {label} | {spread([r['final'] for r in rs])} | {spread([r['best'] for r in rs])} | "
                f"{statistics.mean(r['clients_trained'] for r in rs):.1f} | "
                f"{statistics.mean(r['virtual_time_s'] for r in rs):.0f} |"
            )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

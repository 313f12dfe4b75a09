"""MergeSFL against its baselines on digits or MNIST-1D at non-IID level p (default 10) under `jetson`.

Runs examples/mergesfl/{mergesfl,sfl,adasfl,fedavg,pyramidfl}.yaml, MergeSFL's two ablations
(`merge_features: false`, `regulate_batch: false`) and MergeSFL with `scale_top_lr: false`,
in-process, two at a time, for --seeds seeds; prints, as the mean over seeds (and the range of the
final accuracy), final accuracy (mean of the last 5 rounds), average waiting time per round
(Eq. 8), virtual time, time to the target accuracy and traffic; writes accuracy plots of seed 0
into --plots. `--data mnist1d` swaps the examples' digits and `cnn2` for MNIST-1D and `cnn1d`;
`--set KEY=VALUE` applies to every run (a row's own override, such as an ablation's, wins).

    python bench/mergesfl_p10.py [--data digits] [--p 10] [--rounds 40] [--seeds 10] [--target 0.8]
                                 [--set KEY=VALUE ...] [--plots docs/mergesfl]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = {"digits": ["data.name=digits", "model.name=cnn2"], "mnist1d": ["data.name=mnist1d", "model.name=cnn1d"]}
RUNS = {
    "MergeSFL": ("mergesfl", []),
    "MergeSFL w/o merging": ("mergesfl", ["algorithm.merge_features=false"]),
    "MergeSFL w/o batch regulation": ("mergesfl", ["algorithm.regulate_batch=false"]),
    "MergeSFL, top lr unscaled": ("mergesfl", ["algorithm.scale_top_lr=false"]),
    "AdaSFL": ("adasfl", []),
    "typical SFL": ("sfl", []),
    "FedAvg": ("fedavg", []),
    "PyramidFL (whole model)": ("pyramidfl", []),
}


def one(job: tuple[str, str, list[str], str]) -> dict:
    import pandas as pd

    from rayfl.loader import load_config
    from rayfl.runner import run_local

    label, example, sets, out = job
    summary = run_local(load_config(ROOT / "examples" / "mergesfl" / f"{example}.yaml", sets), out)
    m = pd.read_parquet(Path(out) / "metrics.parquet")
    return {
        "run": label,
        "final": float(m["test_accuracy"].tail(5).mean()),
        "wait": float(m["mean_wait_s"].mean()),
        "virtual": summary["virtual_time_s"],
        "to_target": summary["time_to_target_s"],
        "traffic_mb": summary["bytes_total"] / 1e6,
        "kl": float(m["kl"].mean()) if "kl" in m else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=sorted(DATA), default="digits")
    parser.add_argument("--p", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.8, help="federation.target_accuracy")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument("--plots", default=None, help="folder for accuracy_vs_round.png / accuracy_vs_virtual_time.png")
    args = parser.parse_args()
    common = [*DATA[args.data], f"data.partition.p={args.p}", f"federation.rounds={args.rounds}", f"federation.target_accuracy={args.target}", *args.set]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [
            (label, ex, [*common, f"seed={seed}", *extra], f"{tmp}/{seed}-{label.replace(' ', '_').replace('/', '')}")
            for seed in range(args.seeds)
            for label, (ex, extra) in RUNS.items()
        ]
        with ProcessPoolExecutor(2) as pool:
            rows = list(pool.map(one, jobs))
        if args.plots:
            from rayfl.metrics import plot_runs

            plot_runs([j[3] for j in jobs if j[3].split("/")[-1].startswith("0-")], args.plots)
    sets = f", {' '.join(args.set)}" if args.set else ""
    print(f"{args.data}, 40 workers, p = {args.p:g}, jetson, {args.rounds} rounds, seeds 0..{args.seeds - 1}{sets}; final = mean of the last 5 rounds")
    print(f"| run | final accuracy (range) | mean waiting s/round | virtual time s | time to {args.target:.0%} s | traffic MB | mean KL |")
    print("|---|---|---|---|---|---|---|")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for label in RUNS:
        rs = [r for r in rows if r["run"] == label]
        finals = [r["final"] for r in rs]
        reached = [r["to_target"] for r in rs if r["to_target"] is not None]
        tt = f"{mean(reached):.0f} ({len(reached)}/{len(rs)})" if reached else "-"
        kl = "-" if rs[0]["kl"] is None else f"{mean([r['kl'] for r in rs]):.3f}"
        print(
            f"| {label} | {mean(finals):.4f} ({min(finals):.3f}-{max(finals):.3f}) | {mean([r['wait'] for r in rs]):.1f} | "
            f"{mean([r['virtual'] for r in rs]):.0f} | {tt} | {mean([r['traffic_mb'] for r in rs]):.0f} | {kl} |"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

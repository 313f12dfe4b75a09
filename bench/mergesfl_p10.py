"""MergeSFL against its baselines on digits at non-IID level p (default 10) under `jetson`.

Runs examples/mergesfl/{mergesfl,sfl,adasfl,fedavg,pyramidfl}.yaml and MergeSFL's two ablations
(`merge_features: false`, `regulate_batch: false`), each also with `scale_top_lr: true`,
in-process, two at a time; prints final
accuracy (mean of the last 5 rounds), average waiting time per round (Eq. 8), virtual time,
time to the target accuracy and traffic; writes accuracy-vs-virtual-time plots next to --plots.

    python bench/mergesfl_p10.py [--p 10] [--rounds 40] [--plots docs/mergesfl]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = {
    "MergeSFL": ("mergesfl", []),
    "MergeSFL w/o merging": ("mergesfl", ["algorithm.merge_features=false"]),
    "MergeSFL w/o batch regulation": ("mergesfl", ["algorithm.regulate_batch=false"]),
    "MergeSFL, top lr scaled": ("mergesfl", ["algorithm.scale_top_lr=true"]),
    "MergeSFL w/o merging, top lr scaled": ("mergesfl", ["algorithm.scale_top_lr=true", "algorithm.merge_features=false"]),
    "MergeSFL w/o batch regulation, top lr scaled": ("mergesfl", ["algorithm.scale_top_lr=true", "algorithm.regulate_batch=false"]),
    "AdaSFL": ("adasfl", []),
    "typical SFL": ("sfl", []),
    "FedAvg": ("fedavg", []),
    "PyramidFL (whole model)": ("pyramidfl", []),
}


def one(job: tuple[str, str, list[str], str]) -> dict:
    import pandas as pd

    from rayfl.config import load_config
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
    parser.add_argument("--p", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--plots", default=None, help="folder for accuracy_vs_round.png / accuracy_vs_virtual_time.png")
    args = parser.parse_args()
    common = [f"data.partition.p={args.p}", f"federation.rounds={args.rounds}"]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(label, ex, [*common, *extra], f"{tmp}/{label.replace(' ', '_').replace('/', '')}") for label, (ex, extra) in RUNS.items()]
        with ProcessPoolExecutor(2) as pool:
            rows = list(pool.map(one, jobs))
        if args.plots:
            from rayfl.metrics import plot_runs

            plot_runs([j[3] for j in jobs], args.plots)
    target = 0.8
    print(f"digits, 40 workers, p = {args.p:g}, jetson, {args.rounds} rounds; final = mean of the last 5 rounds")
    print(f"| run | final accuracy | mean waiting s/round | virtual time s | time to {target:.0%} s | traffic MB | mean KL |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        tt = "-" if r["to_target"] is None else f"{r['to_target']:.0f}"
        kl = "-" if r["kl"] is None else f"{r['kl']:.3f}"
        print(f"| {r['run']} | {r['final']:.4f} | {r['wait']:.1f} | {r['virtual']:.0f} | {tt} | {r['traffic_mb']:.0f} | {kl} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

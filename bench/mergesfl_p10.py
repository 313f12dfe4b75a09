"""MergeSFL against its baselines on digits or MNIST-1D at non-IID level p (default 10) under `jetson`.

Runs examples/mergesfl/{mergesfl,sfl,adasfl,fedavg,pyramidfl}.yaml, MergeSFL's two ablations
(`merge_features: false`, `regulate_batch: false`) and MergeSFL with `scale_top_lr: false`,
in-process, two at a time, for --seeds seeds, into --runs (kept there when given), and prints
`rayfl compare`'s table of them: per config, mean +- sd over seeds of the final accuracy (mean
of the last 5 rounds), time and rounds to the target accuracy, virtual time, traffic, average
waiting time per round (Eq. 8) and MergeSFL's mean KL; compare.csv / compare.md and the
accuracy plots land in RUNS/compare. `--data mnist1d` swaps the examples' digits and `cnn2` for
MNIST-1D and `cnn1d`; `--set KEY=VALUE` applies to every run (a row's own override, such as an
ablation's, wins).

    python bench/mergesfl_p10.py [--data digits] [--p 10] [--rounds 40] [--seeds 10] [--target 0.8]
                                 [--set KEY=VALUE ...] [--runs DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rayfl.compare import compare

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


def one(job: tuple[str, list[str], str]) -> None:
    from rayfl.load import load_config
    from rayfl.runner import run_local

    example, sets, out = job
    run_local(load_config(ROOT / "examples" / "mergesfl" / f"{example}.yaml", sets), out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=sorted(DATA), default="digits")
    parser.add_argument("--p", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.8, help="federation.target_accuracy")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    parser.add_argument(
        "--runs",
        default=None,
        help="keep the runs here (default: a temporary folder); rayfl compare writes into RUNS/compare",
    )
    args = parser.parse_args()
    common = [
        *DATA[args.data],
        f"data.partition.p={args.p}",
        f"federation.rounds={args.rounds}",
        f"federation.target_accuracy={args.target}",
        *args.set,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(args.runs or tmp)
        jobs = [
            (
                ex,
                [*common, f"seed={seed}", *extra],
                str(runs / f"{seed}-{label.replace(' ', '_').replace('/', '').replace(',', '')}"),
            )
            for seed in range(args.seeds)
            for label, (ex, extra) in RUNS.items()
        ]
        with ProcessPoolExecutor(2) as pool:
            list(pool.map(one, jobs))
        text, _ = compare([j[2] for j in jobs], runs / "compare", last=5, columns=["kl"])
    sets = f", {' '.join(args.set)}" if args.set else ""
    print(
        f"{args.data}, 40 workers, p = {args.p:g}, jetson, {args.rounds} rounds, seeds 0..{args.seeds - 1}{sets}; "
        "final = mean of the last 5 rounds"
    )
    print(text)


if __name__ == "__main__":
    main()

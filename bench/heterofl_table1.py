"""The shape of HeteroFL's Table 1 on digits: levels a, a-e, a-b-c-d-e, e, a capability mix, and
the baselines AllLarge, AllSmall and ExclusiveFL, each IID and non-IID (2 classes per client).

Runs the configs in `examples/heterofl/` in-process, two at a time, and prints a Markdown
table: model-size ratio, mean parameters and FLOPs of the mix, the IID global accuracy, and the
non-IID local (masked, per client) and global accuracy, each the mean of the last 5 rounds.

    python bench/heterofl_table1.py [--rounds 30] [--seed 0] [--plots docs/heterofl]

With `--plots DIR`, `rayfl compare`'s accuracy plots of the IID and the non-IID runs (DIR/iid/,
DIR/non-iid/).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ["a", "a-e", "a-b-c-d-e", "e", "capability-a-b-c", "alllarge", "allsmall", "exclusivefl"]
SHARDS = "data.partition={kind: shards, classes_per_client: 2}"


def one(job: tuple[str, str, int, int, str]) -> dict:
    import pandas as pd

    from rayfl.load import load_config
    from rayfl.runner import run_local

    setting, split, rounds, seed, out = job
    sets = [f"federation.rounds={rounds}", f"seed={seed}"] + ([SHARDS] if split == "non-iid" else [])
    summary = run_local(load_config(ROOT / "examples" / "heterofl" / f"{setting}.yaml", sets), out)
    tail = pd.read_parquet(Path(out) / "metrics.parquet").tail(5)
    return {
        "setting": setting,
        "split": split,
        "global": float(tail["test_accuracy"].mean()),
        "local": float(tail["test_accuracy_local"].mean()),
        "ratio": summary["model_size_ratio"],
        "params": summary["mean_params"],
        "flops": summary["mean_forward_flops"],
        "clients": int(pd.read_parquet(Path(out) / "clients.parquet")["client_id"].nunique()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plots", type=Path, metavar="DIR", help="accuracy plots of the runs, DIR/iid and DIR/non-iid")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(2) as pool:
        jobs = [
            (s, split, args.rounds, args.seed, f"{tmp}/{s}-{split}") for s in SETTINGS for split in ("iid", "non-iid")
        ]
        rows = list(pool.map(one, jobs))
        if args.plots:
            from rayfl.compare import compare

            for split in ("iid", "non-iid"):
                compare([f"{tmp}/{s}-{split}" for s in SETTINGS], args.plots / split)
    by = {(r["setting"], r["split"]): r for r in rows}
    print(
        f"digits, 20 clients, 10 per round, {args.rounds} rounds, 5 local epochs; accuracy = mean of the last 5 rounds"
    )
    print("| setting | ratio | params | FLOPs | clients trained | IID global | non-IID local | non-IID global |")
    print("|---|---|---|---|---|---|---|---|")
    for s in SETTINGS:
        iid, non = by[(s, "iid")], by[(s, "non-iid")]
        print(
            f"| {s} | {iid['ratio']:.2f} | {iid['params'] / 1e3:.0f} K | {iid['flops'] / 1e6:.2f} M | "
            f"{iid['clients']} | "
            f"{iid['global']:.4f} | {non['local']:.4f} | {non['global']:.4f} |"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

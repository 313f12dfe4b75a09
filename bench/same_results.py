"""Are a set of runs the same, bit for bit, as a reference? (A restructuring's check.)

Runs one small configuration per system (FedAvg, FedProx sequential and vectorized, FedAdam,
FedYogi, HeteroFL, FeDepth, FedSup, E-FedSup, InclusiveFL, DepthFL, MergeSFL, typical split FL,
SplitMix, Ditto with personalization, LG-FedAvg vectorized, PyramidFL, the width and depth
ExclusiveFL baselines; deadline rounds dropping and carrying late updates, FedBuff and FedAsync) and
two whose clients fail (every client diverging; clients with no sample or one, skipped or failed) in
process, each into OUT/<name>/. With `--against REF`, every run's `metrics.parquet` is compared with
REF/<name>/ (all but the wall-clock column), and so is `clients.parquet` over the columns both have
(the columns one of them lacks are listed); the script prints `identical` or the first difference
per run, and exits 1 on any.

    python bench/same_results.py --out /tmp/old                  # on the old code
    python bench/same_results.py --out /tmp/new --against /tmp/old
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from rayfl.load import load_config
from rayfl.runner import run_local

SMALL = ["federation.rounds=3", "metrics.tensorboard=false"]
CONFIGS = {
    "fedavg": [],
    "fedprox": ["algorithm.name=fedprox", "algorithm.mu=0.1"],
    "fedprox_vectorized": ["algorithm.name=fedprox", "algorithm.mu=0.1", "model.name=mlp", "ray.vectorize=4"],
    "fedadam": ["algorithm.name=fedadam"],
    "heterofl": ["algorithm.name=heterofl", "algorithm.levels=a1-c1-e1", "model.norm=sbn"],
    "fedepth": ["algorithm.name=fedepth"],
    "fedsup": ["algorithm.name=fedsup"],
    "efedsup": ["algorithm.name=efedsup"],
    "inclusivefl": ["algorithm.name=inclusivefl"],
    "depthfl": ["algorithm.name=depthfl"],
    "mergesfl": ["algorithm.name=mergesfl"],
    "sfl": ["algorithm.name=sfl"],
    "splitmix": ["algorithm.name=splitmix"],
    "ditto": ["algorithm.name=ditto", "federation.personalize_epochs=1"],
    "fedyogi": ["algorithm.name=fedyogi"],
    "exclusivefl": ["algorithm.name=exclusivefl", "devices.profile=mobile"],
    "exclusivefl_depth": ["algorithm.name=exclusivefl_depth", "devices.profile=mobile"],
    "lgfedavg_vectorized": ["algorithm.name=lgfedavg", "model.name=mlp", "ray.vectorize=3"],
    "pyramidfl": ["algorithm.name=pyramidfl"],
    "deadline_drop": ["federation.mode=deadline", "federation.deadline.target_clients=6"],
    "deadline_carry": [
        "federation.mode=deadline",
        "federation.deadline.target_clients=6",
        "federation.deadline.late=carry",
    ],
    "fedadam_deadline_carry": [
        "algorithm.name=fedadam",
        "federation.mode=deadline",
        "federation.deadline.target_clients=6",
        "federation.deadline.late=carry",
    ],
    "fedbuff": ["federation.mode=async", "federation.async.buffer_size=4"],
    "fedasync": ["federation.mode=async", "federation.async.rule=fedasync", "federation.rounds=6"],
    "heterofl_fedbuff": [
        "algorithm.name=heterofl",
        "algorithm.levels=a1-c1-e1",
        "model.norm=sbn",
        "federation.mode=async",
        "federation.async.buffer_size=4",
    ],
    "diverging": ["model.name=mlp", "federation.lr=1e6"],
    "skipped_and_failed": ["data.num_clients=2000", "data.partition={kind: dirichlet, min_size: 0}"],
}


def tables(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    return pd.read_parquet(run_dir / "metrics.parquet").drop(columns="wall_time_s"), pd.read_parquet(
        run_dir / "clients.parquet"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--against", type=Path)
    parser.add_argument("--only", nargs="*", default=sorted(CONFIGS))
    args = parser.parse_args()
    differ = 0
    for name in args.only:
        run_local(load_config(None, [*SMALL, *CONFIGS[name]]), args.out / name)
        if args.against is None:
            print(f"{name}: written")
            continue
        try:
            (metrics, clients), (old_metrics, old_clients) = tables(args.out / name), tables(args.against / name)
            pd.testing.assert_frame_equal(metrics, old_metrics, check_exact=True)
            common = [c for c in old_clients.columns if c in clients.columns]
            pd.testing.assert_frame_equal(clients[common], old_clients[common], check_exact=True)
            changed = {
                "dropped": sorted(set(old_clients.columns) - set(common)),
                "added": sorted(set(clients.columns) - set(common)),
            }
            print(f"{name}: identical" + "".join(f"; clients.parquet {k} {v}" for k, v in changed.items() if v))
        except AssertionError as exc:
            differ += 1
            print(f"{name}: DIFFERENT {str(exc).splitlines()[0:3]}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

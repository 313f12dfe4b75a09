"""Vectorized clients against sequential ones on the reference FedAvg workload, in process.

Workload: digits IID, 100 clients, 10 per round, 30 rounds, 5 local epochs, batch 10, SGD lr
0.02 momentum 0.9, with an MLP and with `cnn2` (no batch norm). One call takes the round's 10
clients (`ray.clients_per_call: 10`); `ray.vectorize: 10` trains them in one `torch.func.vmap`
computation, `ray.vectorize: 1` one after another. Prints the clients' training per round (the
runner's `run_all`, median over rounds 2 on, past torch's first-call set-up), the whole round
(training, aggregation and evaluation; median), the page faults of a round's training
(median), the final accuracy of each, and the speed-ups. Each side runs in a fresh process,
`--repeats` times, sequential and vectorized alternating; the figures are the medians over
the repeats (this VM's speed drifts between processes).

    python bench/vectorize.py [--rounds 30] [--models mlp cnn2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

BASE = [
    "data.num_clients=100",
    "data.partition.kind=iid",
    "federation.clients_per_round=10",
    "federation.local_epochs=5",
    "federation.batch_size=10",
    "federation.lr=0.02",
    "federation.momentum=0.9",
    "ray.clients_per_call=10",
]


def one(model: str, vectorize: int, rounds: int) -> dict:
    import resource
    import time

    import numpy as np
    import pandas as pd

    from rayfl.engine import ClientRunner
    from rayfl.load import load_config
    from rayfl.runner import run_local

    training: list[float] = []
    faults: list[int] = []
    run_all = ClientRunner.run_all

    def timed(self, tasks):  # the clients' training, timed, with the page faults it took
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        out = run_all(self, tasks)
        training.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return out

    ClientRunner.run_all = timed
    with tempfile.TemporaryDirectory() as out:
        summary = run_local(
            load_config(
                None, [*BASE, f"model.name={model}", f"ray.vectorize={vectorize}", f"federation.rounds={rounds}"]
            ),
            out,
        )
        wall = pd.read_parquet(f"{out}/metrics.parquet")["wall_time_s"].to_numpy()
    return {
        "train_s": float(np.median(training[1:])),
        "faults": float(np.median(faults[1:])),
        "round_s": float(np.median(np.diff(wall))),
        "accuracy": summary["final_test_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn2"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.rounds)))
        return
    print(f"digits IID, 100 clients, 10 a round, {args.rounds} rounds, 5 epochs, batch 10, SGD 0.02 m0.9, in process")
    print(
        "| model | training s a round: sequential / vectorized (10) | speed-up | whole round s: sequential / "
        "vectorized | speed-up | page faults a round | accuracy: sequential / vectorized |"
    )
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        runs: dict[int, list[dict]] = {1: [], 10: []}
        for _ in range(args.repeats):
            for k in (1, 10):
                out = subprocess.run(
                    [sys.executable, __file__, "--one", model, str(k), "--rounds", str(args.rounds)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[k].append(json.loads(out.stdout.strip().splitlines()[-1]))
        s, v = ({key: statistics.median(r[key] for r in runs[k]) for key in runs[k][0]} for k in (1, 10))
        print(
            f"| {model} | {s['train_s']:.3f} / {v['train_s']:.3f} | {s['train_s'] / v['train_s']:.2f}x | "
            f"{s['round_s']:.3f} / {v['round_s']:.3f} | "
            f"{s['round_s'] / v['round_s']:.2f}x | {s['faults']:.0f} / {v['faults']:.0f} | {s['accuracy']:.4f} / "
            f"{v['accuracy']:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

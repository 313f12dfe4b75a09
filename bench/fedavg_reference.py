"""Reference FedAvg workload: rayfl on Ray against a plain sequential single-thread PyTorch loop.

Workload: digits, 100 clients (Dirichlet 0.5), 10 per round, 30 rounds, 5 local epochs,
batch 10, SGD lr 0.02 momentum 0.9, FedAvg's two-conv CNN (`cnn2`), test accuracy every round.
The plain loop (`bench/plain_loops.py:fedavg`, which imports torch and numpy only) does the same
work with the same data, partition, initial weights, client selection and batch order, read
from a file this script writes with rayfl's draws before any timing.

Each side runs as a fresh process and is timed from launch to exit, so imports and, for
rayfl, starting (and stopping) a local Ray cluster and its actors are included. rayfl runs on
Ray as `rayfl run` does by default (dashboard on, its first rounds run in process while Ray
and the actors come up: `ray.start_in_process`), as it did before that (`waiting`: the rounds wait for
the actors), with `ray.dashboard=false`, on a warm
cluster with a warm pool (`rayfl run --address` on a head `rayfl up` keeps, after one untimed
run of the same workload that leaves its actors warm; the head is started for this run and
stopped after it, so no other run shares the machine with it), and once in process (`--local`).
Prints the wall times, the ratios, and the accuracies; also the time of the round loop alone (for rayfl from the first
round's start to the last round's end, Ray already up).

    python bench/fedavg_reference.py [--rounds 30] [--repeat 5] [--runs dashboard waiting no-dashboard warm-pool local]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OVERRIDES = [
    "data.num_clients=100",
    "federation.clients_per_round=10",
    "federation.local_epochs=5",
    "federation.batch_size=10",
    "federation.lr=0.02",
    "federation.momentum=0.9",
    "model.name=cnn2",
]


RUNS = {  # --runs: label, config overrides, `rayfl run` flags (WARM: --address of the warm head)
    "dashboard": ("rayfl, dashboard on", [], []),
    "waiting": ("rayfl, waits for Ray", ["ray.start_in_process=false"], []),
    "no-dashboard": ("rayfl, dashboard off", ["ray.dashboard=false"], []),
    "warm-pool": ("rayfl, warm pool", [], ["--address", "WARM"]),
    "local": ("rayfl --local", [], ["--local"]),
}


def workload(rounds: int, path: Path) -> None:
    """The workload as data for the plain loop (`plain_loops.fedavg`, which imports torch only): the
    digits arrays, the partition, each round's clients and their batch orders, the initial
    weights, all as rayfl draws them."""
    import numpy as np

    from rayfl import rng
    from rayfl.algorithms.local import batch_plan
    from rayfl.algorithms.messages import ClientTask
    from rayfl.data import load_dataset, partition
    from rayfl.load import load_config
    from rayfl.models import build_model, to_numpy

    cfg = load_config(None, [*OVERRIDES, f"federation.rounds={rounds}"])
    fed, seed = cfg.federation, cfg.seed
    ds = load_dataset(cfg.data, seed)
    parts = partition(ds, cfg.data, seed).parts
    with rng.seeded_torch(seed, "init"):
        init = to_numpy(build_model(cfg.model, ds.input_shape, ds.num_classes))
    chosen = [
        sorted(rng.generator(seed, "select", rnd).choice(np.arange(len(parts)), fed.clients_per_round, replace=False))
        for rnd in range(1, rounds + 1)
    ]
    plans = [
        batch_plan(
            seed,
            ClientTask(
                client_id=int(c),
                round=rnd,
                weights={},
                model=cfg.model,
                local_epochs=fed.local_epochs,
                batch_size=fed.batch_size,
                optimizer=None,
            ),
            len(parts[c]),
        )
        for rnd, clients in enumerate(chosen, 1)
        for c in clients
    ]
    arrays = {
        "x_train": ds.x_train,
        "y_train": ds.y_train,
        "x_test": ds.x_test,
        "y_test": ds.y_test,
        "classes": ds.num_classes,
        "lr": fed.lr,
        "momentum": fed.momentum,
        "chosen": np.array(chosen),  # (rounds, clients a round)
        "parts": np.concatenate(parts),
        "part_sizes": np.array([len(p) for p in parts]),
        "order": np.concatenate([b for plan in plans for b in plan]),  # every batch of every client of every round
        "batch_sizes": np.array([len(b) for plan in plans for b in plan]),
        "batches": np.array([len(plan) for plan in plans]),  # per (round, client) in order
        **{f"init/{k}": v for k, v in init.items()},
    }
    np.savez(path, **arrays)


def timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--runs",
        nargs="+",
        choices=list(RUNS),
        default=list(RUNS),
        help="which rayfl runs (a machine without the dashboard's packages: leave out dashboard)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="paired repeats (medians are printed)")
    args = parser.parse_args()

    from actors.driver import head

    if head.kept() is not None:
        sys.exit(
            "bench/fedavg_reference.py: a head rayfl up keeps is running; rayfl down first (its processes would slow "
            "the cold runs)"
        )
    plain_walls, plain_loops, walls, summaries = [], [], {RUNS[r][0]: [] for r in args.runs}, {}
    with tempfile.TemporaryDirectory() as tmp:
        workload(args.rounds, Path(tmp) / "workload.npz")
        for repeat in range(args.repeat):  # each repeat: the plain loop, then every run beside it
            wall, out = timed([sys.executable, str(Path(__file__).parent / "plain_loops.py"), f"{tmp}/workload.npz"])
            plain = json.loads(out.strip().splitlines()[-1])
            plain_walls.append(wall)
            plain_loops.append(plain["loop_s"])
            for which, (label, extra, flags) in enumerate(RUNS[r] for r in args.runs):
                sets = [a for o in [*OVERRIDES, f"federation.rounds={args.rounds}", *extra] for a in ("--set", o)]
                out = f"{tmp}/{which}-{repeat}"
                if "WARM" not in flags:
                    wall, _ = timed([sys.executable, "-m", "rayfl", "run", *flags, *sets, "--out", out])
                else:  # the head started for this run alone; an untimed run of the workload leaves its pool warm
                    flags = [
                        head.up(num_cpus=None, num_gpus=None, dashboard=False)["address"] if f == "WARM" else f
                        for f in flags
                    ]
                    try:
                        timed([sys.executable, "-m", "rayfl", "run", *flags, *sets, "--out", f"{tmp}/warm-up"])
                        wall, _ = timed([sys.executable, "-m", "rayfl", "run", *flags, *sets, "--out", out])
                    finally:
                        head.down()
                walls[label].append(wall)
                summaries[label] = json.loads(Path(out, "summary.json").read_text())
    median = statistics.median
    print(f"workload: digits, 100 clients, 10/round, {args.rounds} rounds, 5 epochs, batch 10, cnn2, SGD 0.02 m0.9")
    print(f"medians of {args.repeat}; ratio: the median of each repeat's wall over the plain loop's beside it")
    print(f"{'':<24}{'process wall s':>16}{'round loop s':>14}{'accuracy':>10}{'ratio (wall)':>14}{'ratio range':>14}")
    plain_row = f"{median(plain_walls):>16.1f}{median(plain_loops):>14.1f}{plain['accuracy']:>10.4f}"
    print(f"{'plain PyTorch loop':<24}{plain_row}")
    for label, summary in summaries.items():
        ratios = [w / p for w, p in zip(walls[label], plain_walls)]
        print(
            f"{label:<24}{median(walls[label]):>16.1f}{summary['wall_time_s']:>14.1f}"
            f"{summary['final_test_accuracy']:>10.4f}{median(ratios):>14.2f}{f'{min(ratios):.2f}-{max(ratios):.2f}':>14}"
        )
    worst = max(abs(s["final_test_accuracy"] - plain["accuracy"]) for s in summaries.values())
    print(f"largest accuracy difference: {worst * 100:.2f} points")


if __name__ == "__main__":
    main()

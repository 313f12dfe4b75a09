"""What a client costs in rayfl's loop beside a plain PyTorch loop doing the same steps, and what crosses.

Two workloads, in this process, on `--device` (cpu by default):

- tiny: digits IID, logistic regression (`mlp` with no hidden layer), 200 clients of about 7
  samples, 2 local epochs of batch 10 (about 2 steps a client), 64 clients a call;
- preresnet18: HeteroFL's PreResNet-18 with group norm on 32x32 RGB images (an image folder
  written to a temporary directory: no download), 64 clients of 10 images, 1 step of batch 10,
  32 clients a call.

rayfl's side is what both executors run: `rayfl.engine.run_group` over a call's tasks (configured
by FedAvg's policy for round 1), summed where they train; sequential and vectorized
(`ray.vectorize` = the call's clients). The plain side is `bench/plain_loops.py:train_cohort` on
the same model, initial weights and client arrays (torch only). Each repeat times the plain loop,
then rayfl sequential, then vectorized, over every client in calls of the workload's size, after
one untimed call of each; the ratio is the median over repeats of each repeat's rayfl time over
the plain loop's beside it.

Then the crossings a client (`rayfl.crossings.Crossings`, exact) of one sequential call: scalar
reads, copies to the device and to the host, syncs a step (reads and copies to the host over the
steps), `load_state_dict` calls and optimizer builds; a second call of the same clients (the
samples are already on the device); and a vectorized call at two widths, to show that its copies
do not grow with the clients it trains.

    python bench/client_cost.py [--workloads tiny preresnet18] [--repeats 5] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from images import image_folder
from plain_loops import train_cohort

WORKLOADS = {
    "tiny": (
        [
            "data.name=digits",
            "data.partition.kind=iid",
            "data.num_clients=200",
            "model.name=mlp",
            "model.hidden=[]",
            "federation.local_epochs=2",
        ],
        64,
    ),
    "preresnet18": (
        [
            "model.name=preresnet18",
            "model.norm=gn",
            "data.partition.kind=iid",
            "data.num_clients=64",
            "federation.local_epochs=1",
        ],
        32,
    ),
}
COMMON = ["federation.batch_size=10", "federation.lr=0.05", "metrics.tensorboard=false"]


def build(workload: str, vectorize: int, folder: Path):
    """The federation of a workload, its round-1 tasks for every client and its call size."""
    from rayfl.engine import build_federation
    from rayfl.load import load_config

    overrides, call = WORKLOADS[workload]
    data = image_folder(folder, 800) if workload == "preresnet18" else []
    fed = build_federation(load_config(None, [*data, *overrides, *COMMON, f"ray.vectorize={vectorize}"]))
    state = fed.policy.init_state(fed.initial_weights())
    tasks = fed.policy.configure(state, 1, list(range(fed.config.data.num_clients)))
    return fed, tasks, call


def calls(tasks: list, size: int) -> list[list]:
    return [tasks[i : i + size] for i in range(0, len(tasks), size)]


def rayfl_side(fed, tasks: list, call: int, device: str):
    """A function that runs every task in calls of `call` through `run_group` and returns its seconds."""
    from rayfl.engine import ClientRunner, run_group, torch_threads

    runner = ClientRunner.of(fed, device)

    def run(groups=None) -> float:
        start = time.perf_counter()
        with torch_threads():
            for group in groups or calls(tasks, call):
                run_group(runner, fed.account, group, True)
        return time.perf_counter() - start

    return run


def plain_side(fed, tasks: list, call: int, device: str):
    """The same clients through `train_cohort` (the plain loop) in calls of `call`."""
    cfg = fed.config.federation
    model = fed.models.build(fed.config.model).to(device)
    weights = {k: torch.as_tensor(v).to(device) for k, v in tasks[0].weights.items()}
    arrays = [fed.clients.train(t.client_id) for t in tasks]

    def run() -> float:
        start = time.perf_counter()
        torch.set_num_threads(1)
        for i in range(0, len(arrays), call):
            train_cohort(
                model, weights, arrays[i : i + call], epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=cfg.lr
            )
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    return run


def crossings(fed, tasks: list, call: int, device: str) -> dict:
    """Counts of one call's clients: the first call, and the same call again."""
    from rayfl.crossings import Crossings
    from rayfl.engine import ClientRunner, run_group, torch_threads

    runner = ClientRunner.of(fed, device)
    group = tasks[:call]
    steps = sum(
        -(-fed.clients.sizes()[t.client_id] // t.batch_size) * t.local_epochs for t in group
    )  # ceil(n / b) per epoch
    out = {}
    with torch_threads():
        run_group(runner, fed.account, tasks[call : 2 * call] or group, True)  # torch's first-call set-up
        for label in ("first", "again"):
            with Crossings() as c:
                run_group(runner, fed.account, group, True)
            out[label] = {
                k: c.total(k) for k in ("scalar_reads", "to_device", "to_host", "load_state_dict", "optimizer_builds")
            }
    out["clients"], out["steps"] = len(group), steps
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-vectorized", action="store_true", help="time the sequential loop only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads:
            seq_fed, tasks, call = build(workload, 1, Path(tmp) / workload)
            sides = {"plain": plain_side(seq_fed, tasks, call, args.device)}
            sides["sequential"] = rayfl_side(seq_fed, tasks, call, args.device)
            if not args.no_vectorized:
                vec_fed, vec_tasks, _ = build(workload, call, Path(tmp) / workload)
                sides["vectorized"] = rayfl_side(vec_fed, vec_tasks, call, args.device)
            for run in sides.values():
                run()  # untimed: torch's first-call set-up, the data's first move
            times = {name: [] for name in sides}
            for _ in range(args.repeats):
                for name, run in sides.items():
                    times[name].append(run() / len(tasks))
            print(f"\n## {workload}: {len(tasks)} clients, {call} a call, device {args.device}")
            print("| side | ms a client (median) | x plain loop (paired median) | range |")
            print("|---|---|---|---|")
            for name, t in times.items():
                ratios = [a / b for a, b in zip(t, times["plain"])]
                print(
                    f"| {name} | {1000 * statistics.median(t):.2f} | {statistics.median(ratios):.2f} | "
                    f"{min(ratios):.2f}-{max(ratios):.2f} |"
                )
            counts = crossings(seq_fed, tasks, call, args.device)
            n, steps = counts["clients"], counts["steps"]
            print(f"\ncrossings a client of one sequential call ({n} clients, {steps} steps):")
            print("| call | scalar reads | to device | to host | syncs a step | load_state_dict | optimizer builds |")
            print("|---|---|---|---|---|---|---|")
            for label in ("first", "again"):
                c = counts[label]
                print(
                    f"| {label} | {c['scalar_reads'] / n:.2f} | {c['to_device'] / n:.2f} | {c['to_host'] / n:.2f} | "
                    f"{(c['scalar_reads'] + c['to_host']) / steps:.2f} | {c['load_state_dict'] / n:.2f} | "
                    f"{c['optimizer_builds'] / n:.2f} |"
                )
            if not args.no_vectorized:
                print("\ncrossings of one vectorized call, by its width K:")
                print("| K | scalar reads | to device | to host | load_state_dict | optimizer builds |")
                print("|---|---|---|---|---|---|")
                for k in (call // 4, call):
                    fed, vec_tasks, _ = build(workload, k, Path(tmp) / workload)
                    c = crossings(fed, vec_tasks, k, args.device)["again"]
                    print(
                        f"| {k} | {c['scalar_reads']} | {c['to_device']} | {c['to_host']} | {c['load_state_dict']} | "
                        f"{c['optimizer_builds']} |"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every system's paper model through rayfl's client loop on one device, as a fraction of the chip.

Each row is a system's model at its paper's batch and input shape, plus pfl-research's CIFAR-10
setting (1000 users of 50 images, a cohort of 50, batch 10, its CNN `cnn_pfl`). rayfl trains a
cohort of clients, one local epoch each, through `rayfl.engine.run_group` (what a client actor
runs: the one client loop, the call's sum on the device), sequentially and, where the algorithm
and model allow, vectorized (all the cohort's clients in one `vmap` call). The floor is a plain
PyTorch loop (`bench/plain_loops.py`, torch only) training the same model on random inputs of the
same shape, at the client's batch and at the round's batch (the cohort's clients' batches side by
side: what one model instance would take if the round's data were pooled). Printed per row:
clients/s, images/s, and rayfl's images/s as a fraction of the plain loop's at each batch.

Inputs are random 32x32 RGB images (`bench/images.py`, no download), 128x128 for the
transformer (128 tokens, its rows); clients draw their samples from that pool (`data.partition:
sampled`), so a population costs nothing until drawn. MergeSFL's row trains its VGG-16 whole
(FedAvg's client): a split round's worker runs the bottom of the same network and the server
its top, one step each per iteration.

    python bench/gpu_scale.py                        # the paper sizes, on CUDA (about 5 minutes on an H100)
    python bench/gpu_scale.py --device cpu --quick   # every row scaled down, on the CPU (under 5 minutes)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from images import image_folder
from plain_loops import plain_throughput

# name: (sets, clients in the cohort, samples a client, quick: (sets, clients, samples) scaled down for a CPU)
ROWS = {
    "HeteroFL PreResNet-18 (sBN), batch 10": (
        ["algorithm.name=heterofl", "algorithm.levels=a1", "model.name=preresnet18", "federation.batch_size=10"],
        10,
        50,
        (["model.rate=0.125"], 4, 20),
    ),
    "FeDepth PreResNet-20, batch 128": (
        ["algorithm.name=fedepth", "model.name=preresnet20", "federation.batch_size=128"],
        10,
        256,
        (["federation.batch_size=32"], 8, 32),
    ),
    "DepthFL PreResNet-20, batch 50": (
        ["algorithm.name=depthfl", "model.name=preresnet20", "federation.batch_size=50"],
        10,
        100,
        ([], 8, 32),
    ),
    "FedSup MobileNetV1 supernet, batch 32": (
        ["algorithm.name=fedsup", "model.name=supernet", "federation.batch_size=32"],
        10,
        64,
        (["model.name=supernet_small"], 8, 32),
    ),
    "E-FedSup MobileNetV1 supernet, batch 32": (
        ["algorithm.name=efedsup", "model.name=supernet", "federation.batch_size=32"],
        10,
        64,
        (["model.name=supernet_small"], 8, 32),
    ),
    "InclusiveFL 12-layer transformer (768), batch 64": (
        [
            "algorithm.name=inclusivefl",
            "model.name=transformer",
            "model.width=768",
            "model.heads=12",
            "model.ffn=3072",
            "model.depth=12",
            "algorithm.depths=4-8-12",
            "devices.profile=mobile",
            "federation.batch_size=64",
            "federation.optimizer=adam",
            "federation.momentum=0",
            "federation.lr=0.0001",
        ],
        10,
        64,
        (["model.width=64", "model.heads=4", "model.ffn=128", "model.depth=3", "algorithm.depths=1-2-3"], 8, 32),
    ),
    "MergeSFL VGG-16 (whole), batch 64": (
        ["algorithm.name=fedavg", "model.name=vgg16", "federation.batch_size=64"],
        10,
        64,
        (["federation.batch_size=16"], 2, 16),
    ),
    "pfl-research CIFAR-10 CNN, 1000 users, cohort 50, batch 10": (
        ["algorithm.name=fedavg", "model.name=cnn_pfl", "data.num_clients=1000", "federation.batch_size=10"],
        50,
        50,
        ([], 8, 32),
    ),
}
COMMON = ["federation.local_epochs=1", "metrics.tensorboard=false", "federation.momentum=0.9"]


def build(sets: list[str], clients: int, samples: int, folder: list[str], vectorize: int):
    from rayfl.engine import build_federation
    from rayfl.load import load_config

    population = [] if any(s.startswith("data.num_clients=") for s in sets) else [f"data.num_clients={clients}"]
    cfg = load_config(
        None,
        [
            *folder,
            f"data.partition={{kind: sampled, mix: iid, size: {samples}}}",
            *population,
            f"federation.clients_per_round={clients}",
            f"ray.clients_per_call={clients}",
            f"ray.vectorize={vectorize}",
            *COMMON,
            *sets,
        ],
    )
    fed = build_federation(cfg)
    state = fed.policy.init_state(fed.initial_weights())
    return fed, fed.policy.configure(
        state,
        1,
        fed.policy.select(state, 1, np.arange(cfg.data.num_clients), fed.policy.config.federation.clients_per_round),
    )


def rayfl_rate(fed, tasks, device: str) -> tuple[float, float]:
    """(clients/s, images/s) of the cohort through `run_group`, after one untimed call."""
    from rayfl.engine import ClientRunner, run_group, torch_threads

    runner = ClientRunner.of(fed, device)
    with torch_threads(torch.get_num_threads()):
        run_group(runner, fed.account, tasks, fed.account.sums)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = run_group(runner, fed.account, tasks, fed.account.sums)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    failed = [r.reason for r in out.settled if r.status != "ok"]
    if failed:
        raise RuntimeError(f"{len(failed)} clients failed: {failed[0]}")
    images = sum(r.outcome.num_samples for r in out.settled)
    return len(tasks) / seconds, images / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="every row scaled down (minutes on a CPU)")
    parser.add_argument("--rows", nargs="*", help="rows whose name contains one of these words")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/gpu_scale.py: no CUDA device here (--device cpu --quick measures the CPU)")
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU, {torch.get_num_threads()} thread"
    print(f"{where}; torch {torch.__version__}; {'quick (scaled down)' if args.quick else 'paper sizes'}")
    print(
        "| system | clients | sequential clients/s | images/s | x plain at client batch | x plain at round batch | "
        "vectorized clients/s | images/s | x plain at round batch |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (sets, clients, samples, quick) in ROWS.items():
            if args.rows and not any(w.lower() in name.lower() for w in args.rows):
                continue
            if args.quick:
                sets, clients, samples = [*sets, *quick[0]], quick[1], quick[2]
            size = 128 if "transformer" in " ".join(sets) else 32
            folder = image_folder(Path(tmp) / f"images{size}", size=size)
            fed, tasks = build(sets, clients, samples, folder, 1)
            batch = tasks[0].batch_size
            model = fed.models.build(fed.policy.global_model()).to(args.device)
            shape = fed.clients.input_shape
            at_client = plain_throughput(model, shape, fed.clients.num_classes, batch, args.device)
            at_round = plain_throughput(model, shape, fed.clients.num_classes, batch * clients, args.device)
            per_s, images = rayfl_rate(fed, tasks, args.device)
            row = (
                f"| {name} | {clients} | {per_s:.1f} | {images:.0f} | {images / at_client:.2f} | "
                f"{images / at_round:.2f} |"
            )
            if fed.vectorizable:
                fed, tasks = build(sets, clients, samples, folder, clients)
                per_s, images = rayfl_rate(fed, tasks, args.device)
                row += f" {per_s:.1f} | {images:.0f} | {images / at_round:.2f} |"
            else:
                row += " - | - | - |"
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

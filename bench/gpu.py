"""Client actors on GPU slices: placement and memory caps, a client over its share, throughput.

Needs a CUDA device (says so and exits 1 without one). Starts one local Ray cluster with the
machine's CPUs and GPUs and runs three parts on it:

1. Placement: 8 client actors at `ray.gpus_per_actor: 0.125`; each reports its device, the GPU
   Ray gave it and torch's per-process memory fraction (`set_per_process_memory_fraction`).
2. A client over its share: InclusiveFL on long synthetic sequences (4096 values, 2048 tokens of
   2) with a transformer whose attention memory grows with depth; depths 1-2-12 at batch 16
   need an estimated 4, 6 and 15 GB (attention scores and softmax of every layer), so with 8
   actors at 0.125 of an 80 GB GPU (10 GB each) the strong class's clients run out of their
   share. Clients hold 40 to 64 samples (sizes capped by `mean_samples: 4`), so the
   coordinator's CPU evaluation of the 12-layer model stays short. Two rounds on 8 actors: the
   strong clients must end as client failures (CUDA out of memory), the weak and medium ones,
   trained on the same GPU at the same time and by the same actors after an out-of-memory, must
   train, and both rounds complete.
3. Throughput: the reference workload (digits, 100 clients, 32 per round, 5 local epochs, batch
   10; `cnn2`, FedAvg's CNN, and an MLP) on 1, 2, 4 and 8 actors at 0.125 GPU and 1 CPU each, 4
   clients per call, and vectorized: `ray.vectorize: 4` on 1 and 8 actors, 8 and 32 (a call of
   that many clients) on 1 actor; then the defaults (`ray.vectorize: auto`,
   `ray.clients_per_call: auto`, `ray.num_actors: auto`) at 1 and at 0.125 GPU per actor:
   clients trained per second in the round loop (rounds 2 on, past CUDA's first-call set-up),
   and final accuracy. `preresnet18` (HeteroFL's PreResNet-18, 11 M parameters: a model that
   loads a GPU) trains on 32x32 RGB images written to a temporary image folder (`data.name: hf`;
   no download), 640 of them in 10 classes; its batch norm (per-client statistics over real rows)
   vectorizes under `auto` too.

    python bench/gpu.py [--rounds 5] [--models cnn2 mlp preresnet18] [--parts placement over-share throughput]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

from images import image_folder

OVER_SHARE = [
    "data.name=synthetic",
    "data.synthetic.dim=4096",
    "data.synthetic.mean_samples=4",
    "data.num_clients=16",
    "model.name=transformer",
    "model.patch=2",
    "model.width=32",
    "model.heads=4",
    "model.ffn=32",
    "model.depth=12",
    "algorithm.name=inclusivefl",
    "algorithm.depths=1-2-12",
    "devices.profile=mobile",
    "devices.mix=1:1:1",
    "federation.rounds=2",
    "federation.clients_per_round=16",
    "federation.batch_size=16",
    "federation.optimizer=adam",
    "federation.lr=0.001",
    "federation.eval_clients=1",
    "federation.eval_batch_size=8",
    "ray.num_actors=8",
    "ray.gpus_per_actor=0.125",
    "ray.clients_per_call=1",
]
REFERENCE = [
    "data.num_clients=100",
    "federation.clients_per_round=32",
    "federation.local_epochs=5",
    "federation.batch_size=10",
    "federation.lr=0.02",
    "federation.momentum=0.9",
]
# (actors, vectorize, gpus per actor): 4 clients per call, or `vectorize` when more (one call then
# trains them in one vmap); "auto": the defaults (num_actors, vectorize and clients_per_call auto)
THROUGHPUT = (
    (1, 1, 0.125),
    (2, 1, 0.125),
    (4, 1, 0.125),
    (8, 1, 0.125),
    (1, 4, 0.125),
    (8, 4, 0.125),
    (1, 8, 0.125),
    (1, 32, 0.125),
    ("auto", "auto", 1.0),
    ("auto", "auto", 0.125),
)


def placement() -> None:
    import ray

    from actors.driver.crew import create_client_actors
    from rayfl.load import load_config

    actors = create_client_actors(
        load_config(None, ["ray.gpus_per_actor=0.125", "ray.num_actors=8"]),
        [f"gpu-bench-{k}" for k in range(8)],
        pooled=False,
    )
    infos = ray.get([a.info.remote() for a in actors])
    for a in actors:
        ray.kill(a)
    print("1. placement: 8 client actors at ray.gpus_per_actor 0.125")
    print("| actor | pid | device | GPU ids | memory fraction |")
    print("|---|---|---|---|---|")
    for k, i in enumerate(infos):
        print(f"| client-{k} | {i['pid']} | {i['device']} | {i['gpu_ids']} | {i['cuda_memory_fraction']} |")


def over_share(out: Path) -> None:
    import pandas as pd

    from rayfl import api
    from rayfl.load import load_config

    summary = api.run(
        load_config(None, OVER_SHARE),
        out / "over-share",
        progress=lambda row: print(
            f"  round {row['round']} done, test accuracy {row.get('test_accuracy')}", flush=True
        ),
    )
    clients = pd.read_parquet(out / "over-share" / "clients.parquet")
    metrics = pd.read_parquet(out / "over-share" / "metrics.parquet")
    print("\n2. a client over its share: InclusiveFL depths 1-2-12 on 2048-token sequences, 8 actors at 0.125 GPU")
    print("| round | device | depth | clients | ok | failed | reason |")
    print("|---|---|---|---|---|---|---|")
    depth = dict(zip(("weak", "medium", "strong"), (1, 2, 12)))
    for (rnd, dev), rows in clients.groupby(["round", "device"], sort=True):
        reasons = sorted({r.split(".")[0] for r in rows["reason"].dropna() if r})
        print(
            f"| {rnd} | {dev} | {depth[dev]} | {len(rows)} | {(rows.status == 'ok').sum()} | "
            f"{(rows.status == 'failed').sum()} | {'; '.join(reasons)[:90]} |"
        )
    print(f"rounds completed: {len(metrics)} of 2; final test accuracy {summary['final_test_accuracy']:.4f}")


def throughput(out: Path, models: list[str], rounds: int) -> None:
    import pandas as pd

    from rayfl import api
    from rayfl.load import load_config

    print(
        f"\n3. throughput: reference workload, 32 clients per round, {rounds} rounds, 1 CPU per actor, 4 clients per "
        "call (vectorize K > 4: K; auto: the defaults)"
    )
    print(
        "| model | GPU per actor | actors | vectorize | clients/s (rounds 2 on) | round s (median) | final accuracy |"
    )
    print("|---|---|---|---|---|---|---|")
    data = {model: [f"model.name={model}"] for model in models}
    if "preresnet18" in models:
        data["preresnet18"] = [*image_folder(out / "images"), "model.name=preresnet18"]
    for model in models:
        for actors, vectorize, gpus in THROUGHPUT:
            run = out / f"{model}-{actors}-{vectorize}-{gpus}"
            per_call = "auto" if vectorize == "auto" else max(4, vectorize)
            sets = [
                *REFERENCE,
                *data[model],
                f"federation.rounds={rounds}",
                f"ray.gpus_per_actor={gpus}",
                f"ray.num_actors={actors}",
                f"ray.vectorize={vectorize}",
                f"ray.clients_per_call={per_call}",
            ]
            summary = api.run(load_config(None, sets), run)
            wall = pd.read_parquet(run / "metrics.parquet")["wall_time_s"].diff().iloc[1:]
            print(
                f"| {model} | {gpus:g} | {actors} | {vectorize} | {32 / wall.mean():.1f} | {wall.median():.2f} | "
                f"{summary['final_test_accuracy']:.4f} |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=["cnn2", "mlp"])
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["placement", "over-share", "throughput"],
        default=["placement", "over-share", "throughput"],
    )
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="  %(name)s: %(message)s"
    )  # rayfl's own lines (actors placed, retries)
    import ray
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/gpu.py: no CUDA device here")
    print(
        f"{torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB; "
        f"{os.cpu_count()} CPUs; torch {torch.__version__}, ray {ray.__version__}"
    )
    ray.init(
        address="local",
        num_cpus=os.cpu_count(),
        num_gpus=torch.cuda.device_count(),
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if "placement" in args.parts:
                placement()
            if "over-share" in args.parts:
                over_share(Path(tmp))
            if "throughput" in args.parts:
                throughput(Path(tmp), args.models, args.rounds)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()

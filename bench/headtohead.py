"""The five systems and their baselines head to head: one dataset, one device population, one
virtual clock, the same rounds, over seeds.

Every run shares the data (--dataset, 20 clients, Dirichlet alpha 1.0), the devices (the `tiers`
profile: weak : medium : strong = 5 : 3 : 2, memory 3 / 8 / 32 MiB, the weak tier fitting about a
fifth of the ResNet-20's width), 10 clients a round, the rounds (--rounds) and the seeds. Each
method keeps its own paper's model and local recipe, from its example (examples/fedepth/*,
examples/fedsup/*, examples/inclusivefl/*, examples/mergesfl/*): the width and depth methods
train the pre-activation ResNet-20 (FeDepth's Table 2), FedSup and E-FedSup the small supernet,
InclusiveFL transformers of depths 2 / 4 / 6 (the weak / medium / strong groups), MergeSFL its
split CNN (the dataset's: `cnn2` on digits, `cnn1d` on MNIST-1D). FedAvg runs twice on the
ResNet-20: at the width that fits the weakest device's memory (as HeteroFL's budget mode
measures it) and at full width on every device (ignoring memory).

Writes each run to OUT/DATASET/METHOD-SEED (seed by seed; a rerun reuses the finished runs), then
`rayfl compare`'s table (final = mean of the last --last evaluations, best, time and rounds to
--target, virtual time, traffic, waiting) with one row per method, each method's own sub-model
accuracies (its tiers: HeteroFL's levels, FedSup's children, DepthFL's exits, SplitMix's widths,
InclusiveFL's groups), and the accuracy plots (against round, virtual time and traffic) to
OUT/DATASET/.

    python bench/headtohead.py [--dataset digits] [--rounds 60] [--seeds 3] [--procs 2] [--methods ...]
                               [--out runs/headtohead]
"""

from __future__ import annotations

import argparse
import functools
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FULL_WIDTH = "fedepth/fedavg_min.yaml"
METHODS = {  # label -> (example, overrides)
    "FedAvg (weakest width)": (FULL_WIDTH, ["model.rate=WEAKEST"]),
    "FedAvg (full width)": (FULL_WIDTH, ["model.rate=1.0"]),
    "HeteroFL": ("fedepth/heterofl.yaml", []),
    "SplitMix": ("fedepth/splitmix.yaml", []),
    "DepthFL": ("fedepth/depthfl.yaml", []),
    "FeDepth": ("fedepth/fedepth.yaml", []),
    "m-FeDepth": ("fedepth/mfedepth.yaml", []),
    "FedSup": ("fedsup/fedsup.yaml", ["federation.personalize_epochs=0"]),
    "E-FedSup": ("fedsup/efedsup.yaml", ["federation.personalize_epochs=0"]),
    "InclusiveFL": ("inclusivefl/inclusivefl.yaml", []),
    "MergeSFL": ("mergesfl/mergesfl.yaml", ["model.name=SPLIT"]),
}
TARGETS = {"digits": 0.8, "mnist1d": 0.5}


def common(dataset: str, rounds: int, seed: int) -> list[str]:
    """What every run shares: data, devices, participation, rounds, evaluation, seed."""
    return [
        f"data.name={dataset}",
        "data.num_clients=20",
        "data.partition={kind: dirichlet, alpha: 1.0}",
        "devices.profile=tiers",
        f"federation.rounds={rounds}",
        "federation.clients_per_round=10",
        f"federation.eval_every={max(rounds // 20, 1)}",
        f"federation.target_accuracy={TARGETS[dataset]}",
        "federation.checkpoint_every=0",
        f"seed={seed}",
    ]


def config(label: str, dataset: str, rounds: int, seed: int):
    """The method's example with the shared settings; a warm-up (FedSup's 20 rounds of 500) is
    cut to a tenth of the run."""
    from rayfl.algorithms.sfl import SPLIT_MODELS
    from rayfl.load import load_config

    example, sets = METHODS[label]
    given = {
        "model.rate=WEAKEST": lambda: f"model.rate={weakest_width(dataset, rounds)}",
        "model.name=SPLIT": lambda: f"model.name={SPLIT_MODELS[dataset]}",
    }
    sets = [given[s]() if s in given else s for s in sets]
    overrides = [*sets, *common(dataset, rounds, seed)]
    warmup = load_config(ROOT / "examples" / example).federation.lr_schedule.warmup_rounds
    if warmup:
        overrides.append(f"federation.lr_schedule.warmup_rounds={min(warmup, max(rounds // 10, 1))}")
    return load_config(ROOT / "examples" / example, overrides)


@functools.lru_cache
def weakest_width(dataset: str, rounds: int) -> float:
    """The widest ResNet-20 that the weakest device can train (HeteroFL's budget mode's measure)."""
    from rayfl.algorithms.budget import client_rates
    from rayfl.engine import build_federation, torch_threads
    from rayfl.load import load_config

    cfg = load_config(ROOT / "examples" / FULL_WIDTH, ["model.rate=1.0", *common(dataset, rounds, 0)])
    with torch_threads():
        fed = build_federation(cfg)
    return float(client_rates(cfg, fed.context).min())


def one(job: tuple[str, str, int, int, str]) -> str:
    from rayfl.runner import run_local

    label, dataset, rounds, seed, out = job
    if not (Path(out) / "summary.json").is_file():  # a finished run is kept: rerun only what is missing
        run_local(config(label, dataset, rounds, seed), out)
    return out


def tiers(groups, names) -> str:
    """Each method's own sub-model accuracies at the last evaluation, mean over seeds."""
    lines = ["| method | sub-models: final test accuracy (mean over seeds) |", "|---|---|"]
    for group, name in zip(groups, names):
        columns = sorted(c for c in group[0].metrics if c.startswith("test_accuracy@"))
        cells = []
        for c in columns:
            values = [float(r.metrics.dropna(subset=[c])[c].iloc[-1]) for r in group]
            cells.append(f"{c.split('@', 1)[1]} {sum(values) / len(values):.3f}")
        lines.append(f"| {name} | {' / '.join(cells) if cells else '- (one model)'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=list(TARGETS), default="digits")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2, help="runs at a time, one process (and one torch thread) each")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--target", type=float, help=f"time to this accuracy (default: {TARGETS})")
    parser.add_argument("--last", type=int, default=3, help="final accuracy: the mean of the last evaluations")
    parser.add_argument("--out", default="runs/headtohead")
    args = parser.parse_args()
    from rayfl import compare

    out = Path(args.out) / args.dataset
    folder = {label: label.replace(" ", "_").replace("(", "").replace(")", "") for label in args.methods}
    jobs = [
        (label, args.dataset, args.rounds, seed, str(out / f"{folder[label]}-{seed}"))
        for seed in range(args.seeds)
        for label in args.methods
    ]  # seed by seed: a cut-off bench leaves whole seeds
    with ProcessPoolExecutor(args.procs) as pool:
        list(pool.map(one, jobs))
    groups = [
        [compare.Run.read(out / f"{folder[label]}-{seed}") for seed in range(args.seeds)] for label in args.methods
    ]
    target = args.target or TARGETS[args.dataset]
    frame = compare.table(groups, target, args.last, names=args.methods)
    text = compare.markdown(frame)
    plots = compare.plot(groups, out, names=args.methods)
    (out / "headtohead.md").write_text(text + "\n\n" + tiers(groups, args.methods) + "\n")
    frame.to_csv(out / "headtohead.csv", index=False)
    print(
        f"{args.dataset}, {args.rounds} rounds, seeds 0..{args.seeds - 1}, tiers 5:3:2; target {target}; final = "
        f"mean of the last {args.last} evaluations"
    )
    if "FedAvg (weakest width)" in args.methods:
        print(f"FedAvg (weakest width): width rate {weakest_width(args.dataset, args.rounds):.4f}")
    print(text)
    print()
    print(tiers(groups, args.methods))
    print("plots:", *plots)
    assert all(not math.isnan(v) for v in frame["final_accuracy_mean"]), "a method was never evaluated"


if __name__ == "__main__":
    main()

"""Accuracy against FLOPs of sub-nets sampled from trained supernets (FedSup's Fig. 5).

For each RUN_DIR (a `fedsup` or `efedsup` run), loads its last checkpoint, samples --subnets
sub-nets (seeded, the same ones for every run), and measures each one's inference FLOPs per sample
(the same per-part cost model the runs use), its initial accuracy (on each client's own test
data, averaged over clients) and its personalized accuracy (the head fine-tuned per client for
the run's `personalize_epochs`, default 5). Prints the figures and draws both against FLOPs, one
colour per run, with each run's Pareto front.

    python bench/fedsup_pareto.py RUN_DIR [RUN_DIR ...] [--subnets 500] [--out pareto.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def front(flops: np.ndarray, acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Pareto front: the sub-nets no cheaper sub-net beats."""
    order = np.argsort(flops)
    best, xs, ys = -1.0, [], []
    for i in order:
        if acc[i] > best:
            best = acc[i]
            xs.append(flops[i])
            ys.append(acc[i])
    return np.array(xs), np.array(ys)


def measure(run_dir: Path, count: int) -> dict[str, np.ndarray]:
    from rayfl import checkpoint, rng
    from rayfl.algorithms.aggregate import extract
    from rayfl.algorithms.base import head_scores
    from rayfl.engine import build_federation, torch_threads
    from rayfl.load import load_config
    from rayfl.models.supernet import crop, random_subnet

    cfg = load_config(run_dir / "config.yaml")
    if not cfg.federation.personalize_epochs:
        cfg = cfg.model_copy(update={"federation": cfg.federation.model_copy(update={"personalize_epochs": 5})})
    with torch_threads():
        fed = build_federation(cfg)
        state = checkpoint.latest(run_dir).state
        policy, ev = fed.policy, fed.evaluator
        g = rng.generator(0, "pareto")
        out: dict[str, list[float]] = {"flops": [], "initial": [], "personal": []}
        for _ in range(count):
            s = random_subnet(cfg.model, g)
            model = ev.models.load(s.config(cfg.model), extract(state.weights, policy.sub_shapes(s), where=crop))
            scores = head_scores(policy, model, state.round, ev)
            out["flops"].append(policy.costs(s).forward_flops)
            out["initial"].append(scores["initial_accuracy"])
            out["personal"].append(scores["personal_accuracy"])
    return {k: np.array(v) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--subnets", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("pareto.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for run in args.runs:
        m = measure(run, args.subnets)
        name = run.name
        print(
            f"{name}: {args.subnets} sub-nets, FLOPs {m['flops'].min():.3g}..{m['flops'].max():.3g}; initial "
            f"{m['initial'].mean():.4f} (best {m['initial'].max():.4f}), personalized {m['personal'].mean():.4f} "
            f"(best {m['personal'].max():.4f})"
        )
        for ax, key in zip(axes, ("initial", "personal")):
            dots = ax.scatter(m["flops"] / 1e6, m[key], s=6, alpha=0.35, label=name)
            xs, ys = front(m["flops"], m[key])
            ax.plot(xs / 1e6, ys, color=dots.get_facecolor()[0], alpha=1.0, linewidth=1.5)
    for ax, title in zip(axes, ("initial accuracy", "personalized accuracy (head fine-tuned)")):
        ax.set_xlabel("inference MFLOPs per sample")
        ax.set_ylabel("mean accuracy over clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Sync, deadline and asynchronous federations head to head on the virtual clock (docs/time.md).

Runs examples/time/{sync,deadline,fedbuff,fedasync}.yaml (FedAvg on digits, 50 clients on the
`jetson` profile, 400 client updates each) in process for --seeds seeds, --procs at a time,
then writes `rayfl compare`'s table and plots of them (target accuracy 0.9: the virtual time
and rounds to reach it) and the timelines of seed 0's deadline and FedBuff runs into --out,
and prints the table. `--set KEY=VALUE` applies to every run.

    python bench/time_modes.py [--seeds 3] [--procs 2] [--out docs/time] [--runs DIR] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("sync", "deadline", "fedbuff", "fedasync")


def one(job: tuple[str, int, list[str], str]) -> str:
    from rayfl.load import load_config
    from rayfl.runner import run_local

    name, seed, sets, out = job
    run_local(
        load_config(ROOT / "examples" / "time" / f"{name}.yaml", [*sets, f"seed={seed}", "metrics.tensorboard=false"]),
        out,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "docs" / "time"))
    parser.add_argument("--runs", help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    from rayfl.compare import compare
    from rayfl.timeline import draw

    runs = Path(args.runs or tempfile.mkdtemp(prefix="rayfl-time-"))
    jobs = [(name, seed, args.set, str(runs / f"{name}-seed{seed}")) for name in CONFIGS for seed in range(args.seeds)]
    with ProcessPoolExecutor(args.procs) as pool:
        dirs = list(pool.map(one, jobs))
    text, written = compare(dirs, args.out, target=0.9)
    print(text)
    for name in ("deadline", "fedbuff"):
        written.append(draw(runs / f"{name}-seed0", Path(args.out) / f"timeline_{name}.png", "1-12"))
    print(f"{args.out}: {', '.join(p.name for p in written)}; runs in {runs}")


if __name__ == "__main__":
    main()

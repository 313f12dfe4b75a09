"""Time to target accuracy when devices come and go: sync FedAvg, deadline FedAvg and FedBuff,
each with every device always online, with diurnal availability, and on a generated trace.

Every run shares the data (digits, 100 clients, Dirichlet alpha 1.0), the model (the default
CNN), 10 clients a round (deadline: K = 10 of 13 selected; FedBuff: 10 in flight, a step per 5
updates, twice the steps so that every method aggregates the same number of updates), the
target and the seeds. The availability settings:
- `always`: the `jetson` profile, every device online throughout;
- `diurnal`: the `jetson` profile, online 30% of the day on average (amplitude 0.8), in sessions
  of 10 minutes on average: a task outlasting its session drops;
- `trace`: a trace made by `rayfl traces generate --devices 1000` (phones: log-normal compute,
  WiFi / LTE / 3G links, batteries, diurnal sessions of 30 minutes), its own intervals.

Writes each run to OUT/MODE-AVAILABILITY-SEED (seed by seed; a rerun reuses finished runs),
then `rayfl compare`'s table to OUT/devices.md and the accuracy plots to OUT/.

    python bench/devices.py [--seeds 3] [--rounds 40] [--procs 2] [--out runs/devices]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

TARGET = 0.85
MODES = {
    "sync FedAvg": [],
    "deadline FedAvg": [
        "federation.mode=deadline",
        "federation.deadline.target_clients=10",
        "federation.deadline.over_selection=0.3",
    ],
    "FedBuff": ["federation.mode=async", "federation.async.concurrency=10", "federation.async.buffer_size=5"],
}
AVAILABILITY = {
    "always": [],
    "diurnal": ["devices.availability={kind: diurnal, on_fraction: 0.3, session_s: 600, amplitude: 0.8}"],
    "trace": ["devices.trace=TRACE", "devices.availability.kind=trace"],
}


def config(mode: str, availability: str, rounds: int, seed: int, trace: str):
    from rayfl.load import load_config

    steps = rounds * 2 if mode == "FedBuff" else rounds  # a FedBuff step aggregates 5 updates, a round 10
    sets = [s.replace("TRACE", trace) for s in AVAILABILITY[availability]]
    return load_config(
        None,
        [
            "data.num_clients=100",
            "data.partition={kind: dirichlet, alpha: 1.0}",
            "federation.clients_per_round=10",
            f"federation.rounds={steps}",
            f"federation.eval_every={max(steps // 20, 1)}",
            f"federation.target_accuracy={TARGET}",
            "federation.checkpoint_every=0",
            "metrics.tensorboard=false",
            f"seed={seed}",
            *MODES[mode],
            *sets,
        ],
    )


def one(job: tuple[str, str, int, int, str, str]) -> str:
    from rayfl.runner import run_local

    mode, availability, rounds, seed, trace, out = job
    if not (Path(out) / "summary.json").is_file():
        run_local(config(mode, availability, rounds, seed, trace), out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--procs", type=int, default=2, help="runs at a time, one process each")
    parser.add_argument("--out", default="runs/devices")
    args = parser.parse_args()
    from rayfl import compare
    from rayfl.devices.trace import generate_trace, write_trace

    out = Path(args.out)
    trace = out / "trace"
    if not (trace / "intervals.parquet").is_file():
        write_trace(*generate_trace(1000, seed=0, days=7), trace)
    names = [(m, a) for m in MODES for a in AVAILABILITY]
    folder = lambda m, a, s: str(out / f"{m.replace(' ', '_')}-{a}-{s}")
    jobs = [(m, a, args.rounds, s, str(trace), folder(m, a, s)) for s in range(args.seeds) for m, a in names]
    with ProcessPoolExecutor(args.procs) as pool:
        list(pool.map(one, jobs))
    groups = [[compare.Run.read(folder(m, a, s)) for s in range(args.seeds)] for m, a in names]
    labels = [f"{m}, {a}" for m, a in names]
    frame = compare.table(groups, TARGET, 3, ["num_dropped", "num_skipped", "energy_j"], names=labels)
    text = compare.markdown(frame, ["num_dropped", "num_skipped", "energy_j"])
    compare.plot(groups, out, names=labels)
    (out / "devices.md").write_text(text + "\n")
    frame.to_csv(out / "devices.csv", index=False)
    print(
        f"digits, 100 clients, {args.rounds} rounds (FedBuff {2 * args.rounds} steps), seeds 0..{args.seeds - 1}; "
        f"target {TARGET}"
    )
    print(text)


if __name__ == "__main__":
    main()

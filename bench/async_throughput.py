"""Asynchronous throughput on Ray: clients trained per wall second on 1 and 2 client actors.

One FedBuff federation (`federation.mode: async`; CNN on digits, 40 clients, 3 local epochs,
20 clients in flight, a server step per 10 updates, evaluated at the last step only) run on a
local Ray cluster with 1 actor, then with 2 (each `cpus_per_actor: 1`, 2 clients a call),
side by side in one process. Throughput is the clients whose updates the server received,
over the wall seconds of the round loop (`rayfl.api.run`'s `rounds` phase: actors started
and warmed before it). The two runs' tables are identical (the order of events is a pure
function of the seed); the benchmark checks that too.

    python bench/async_throughput.py [--steps 30] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

BASE = [
    "data.num_clients=40",
    "federation.local_epochs=3",
    "federation.mode=async",
    "federation.async.concurrency=20",
    "federation.async.buffer_size=10",
    "federation.checkpoint_every=0",
    "ray.dashboard=false",
    "ray.cpus_per_actor=1",
    "ray.clients_per_call=2",
    "metrics.tensorboard=false",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="server steps per run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    from rayfl import api
    from rayfl.load import load_config

    tables, rates = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for actors in (1, 2):
            sets = [
                *BASE,
                f"federation.rounds={args.steps}",
                f"federation.eval_every={args.steps}",
                f"ray.num_actors={actors}",
                *args.set,
            ]
            timings: dict[str, float] = {}
            out = Path(tmp) / f"actors{actors}"
            api.run(load_config(None, sets), out, timings=timings)
            clients = pd.read_parquet(out / "clients.parquet")
            tables[actors] = clients
            rates[actors] = len(clients) / timings["rounds"]
            print(
                f"{actors} actor(s): {len(clients)} clients in {timings['rounds']:.1f} s of rounds: "
                f"{rates[actors]:.1f} clients/s"
            )
    pd.testing.assert_frame_equal(tables[1], tables[2])
    print(f"2 actors / 1 actor: {rates[2] / rates[1]:.2f}x (identical tables)")


if __name__ == "__main__":
    main()

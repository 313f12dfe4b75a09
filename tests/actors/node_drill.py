"""A run on a 4-node `ray.cluster_utils.Cluster` that loses the coordinator's node and then a
client's node (`python -m tests.actors.node_drill RUN_DIR ROUNDS`; prints what it killed as JSON).

The head has no CPU, so every actor lives on a worker node: A and B carry the resource `coord`
(the coordinator runs where it is, `ray.coordinator_node: coord`), C does not; each has one
CPU for one of the two client actors. Once round 3 is checkpointed the coordinator's node goes
(Ray restarts the coordinator on the other `coord` node, and it resumes); once round 6 is, the
node of a client that does not host the coordinator. Each kill is made from the progress
callback under `drills.AHEAD`, so it lands while the run goes on whatever the machine's load.
Without the bound a clean-clone CI run hung here until its 600 s timeout (2026-11-27); the
likely cause, not proven: the rounds were done before the driver passed on round 3, and the
drill then waited on actors Ray could not place again (`node_of`, 120 s each)."""

import json
import sys
import time
from pathlib import Path

import ray
from ray._private import state
from ray.cluster_utils import Cluster

from actors.driver.head import SYSTEM_CONFIG
from rayfl import api
from rayfl.load import load_config
from tests.actors.drills import AHEAD, actors_of


def node_of(actor) -> str:
    """The node an actor lives on, once it is alive (a restarting actor has no node yet)."""
    deadline = time.time() + 120
    while True:
        info = state.actors(actor._actor_id.hex())
        if info.get("State") == "ALIVE" or time.time() > deadline:
            return info["Address"]["NodeID"]
        time.sleep(0.1)


def main(run_dir: Path, rounds: int) -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": SYSTEM_CONFIG},
    )
    workers = {
        name: cluster.add_node(num_cpus=1, resources=res)
        for name, res in (("A", {"coord": 1}), ("B", {"coord": 1}), ("C", {}))
    }
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    overrides = [
        f"federation.rounds={rounds}",
        "federation.checkpoint_every=1",
        "model.name=mlp",
        "clock=emulate",
        "clock_scale=0.01",
        AHEAD,  # the coordinator never more than a round past the row a kill is made at
    ]
    cfg = load_config(None, [*overrides, "ray.num_actors=2", "ray.coordinator_node=coord", "ray.actor_timeout_s=120"])
    killed = []

    def coordinator_node():
        where = node_of(actors_of(run_dir.name, "coordinator")[0])
        return next((n, w) for n, w in workers.items() if w.node_id == where)

    def client_node():
        hosts = {node_of(a) for a in actors_of(run_dir.name, "client")} - {
            node_of(actors_of(run_dir.name, "coordinator")[0])
        }
        return next((n, w) for n, w in workers.items() if w.node_id in hosts and n not in killed)

    picks = {3: coordinator_node, 6: client_node}

    def drill(row) -> None:
        """Called by the driver with each round's row, after its checkpoint: the run's actors live
        at least until it returns (however fast the rounds went meanwhile on a busy machine)."""
        if row["round"] in picks and len(killed) < len(picks):
            name, node = picks[row["round"]]()
            cluster.remove_node(node, allow_graceful=False)
            killed.append(name)

    try:
        summary = api.run(cfg, run_dir, progress=drill)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps({"killed": killed, "rounds": summary["rounds"]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))

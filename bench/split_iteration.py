"""One split-learning iteration with W workers (10 by default): on Ray (workers pinned to client
actors) against the same iterations in one process.

Both sides run the same exchange (`Executor.exchange`): every worker forwards a batch through its bottom
model, the coordinator merges the features and steps the top model, every worker gets its
gradient and steps. Ray's side crosses process boundaries twice per worker per iteration
(features up, gradients down); the in-process side calls the same functions directly. Prints the
mean milliseconds per iteration of each, the overhead, and Ray's per-worker cost.

    python bench/split_iteration.py [--workers 10] [--iterations 50] [--actors 2] [--batch 16]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=10)
    args = parser.parse_args()

    import ray

    from actors.coordinator.executor import RayExecutor
    from actors.driver.crew import create_client_actors
    from actors.names import FederationRef
    from rayfl.engine import build_federation, torch_threads
    from rayfl.load import load_config
    from rayfl.runner import InProcessExecutor

    sets = [
        "algorithm.name=sfl",
        "algorithm.merge_features=true",
        f"algorithm.tau={args.iterations}",
        "model.name=cnn2",
        f"federation.batch_size={args.batch}",
        f"data.num_clients={max(20, args.workers)}",
        f"federation.clients_per_round={args.workers}",
    ]
    timings = {}
    with torch_threads():
        fed = build_federation(load_config(None, sets))
        state = fed.policy.init_state(fed.initial_weights())

        tasks = fed.policy.configure(state, 1, list(range(args.workers)))

        def timed(executor) -> float:
            executor.exchange(tasks, fed.policy.open_driver(state, 1, tasks))  # warm-up (first autograd calls)
            driver = fed.policy.open_driver(state, 1, tasks)
            start = time.perf_counter()
            executor.exchange(tasks, driver)
            return (time.perf_counter() - start) / args.iterations * 1e3

        timings["in one process"] = timed(InProcessExecutor(fed))
        ray.init(address="local", num_cpus=args.actors, include_dashboard=False, log_to_driver=False)
        try:
            actors = create_client_actors(fed.config, [f"bench-{k}" for k in range(args.actors)], pooled=False)
            ray.get([a.info.remote() for a in actors])
            timings[f"on Ray, {args.actors} actors"] = timed(
                RayExecutor(actors, FederationRef(ray.put(fed)), fed.account)
            )
        finally:
            ray.shutdown()
    base, on_ray = timings.values()
    print(
        f"{args.workers} workers, cnn2 cut after its convs, batch {args.batch}, merged features, {args.iterations} "
        "iterations"
    )
    for label, ms in timings.items():
        print(f"{label:<22}{ms:8.1f} ms / iteration")
    print(
        f"Ray overhead: {on_ray - base:+.1f} ms / iteration ({on_ray / base:.2f}x), "
        f"{(on_ray - base) / args.workers:+.2f} ms per worker"
    )


if __name__ == "__main__":
    main()

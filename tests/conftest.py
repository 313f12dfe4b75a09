"""Shared fixtures: datasets are loaded once per session; one local Ray cluster (2 CPUs, 2 logical
GPUs, a small object store, no dashboard) for every test that asks for it.

The suite runs on two pytest-xdist workers (`addopts` in pyproject.toml), each with a session cluster
of its own where it needs one. The tests on a session cluster run in two groups, each whole on one
worker: the fault drills and Tune's trials, and the others (so a cluster starts at most once per
worker); a test that starts a cluster of its own (a head in a subprocess, a multi-node drill) runs on
either, beside them.

Each worker computes on one thread (`OMP_NUM_THREADS=1` and the like, inherited by the runs, heads
and jobs the tests start as processes; `torch.set_num_threads(1)` for torch, whatever imported it
first). Two workers on two cores then never oversubscribe them: with both cores kept busy by other
work, torch's OpenMP threads spin waiting on each other and a test that builds models outside a
run's one-thread block took 5 to 8 times longer (the FedSup tier test: 96 s, 18 s on one thread).
Training and evaluation run on one thread anyway (rayfl/engine/host.py): no result changes.
"""

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import logging  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from rayfl.data import load_dataset  # noqa: E402
from rayfl.load import parse_config  # noqa: E402

torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            drills = item.get_closest_marker("faults") or "tune" in item.path.parts
            item.add_marker(pytest.mark.xdist_group("ray-drills-and-tune" if drills else "ray"))
    # The README tour (minutes, the longest test of the slow suite) is handed out first, so the
    # other worker's tests run beside it rather than after it.
    items.sort(key=lambda item: item.path.name != "test_readme.py")


@pytest.fixture
def rayfl_notes():
    """The messages rayfl logs during this test, by a handler of its own on the `rayfl` logger:
    never a shared handler (pytest's caplog sits on the root, which `rayfl.cli.main` stops rayfl's
    records reaching, and which handlers an earlier test left behind may feed twice)."""
    notes: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: notes.append(record.getMessage())
    log = logging.getLogger("rayfl")
    log.addHandler(handler)
    yield notes
    log.removeHandler(handler)


@pytest.fixture(scope="session")
def digits():
    return load_dataset(parse_config({}).data, seed=0)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    from actors.driver.head import SYSTEM_CONFIG

    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=2,
        object_store_memory=200 * 1024**2,
        include_dashboard=False,
        log_to_driver=False,
        _system_config=SYSTEM_CONFIG,  # as rayfl starts its clusters: the workers not behind a busy machine's work
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def idle_cluster(ray_cluster):
    """The session's cluster with the warm pool drained and every CPU and GPU free again (for
    tests that place actors of their own)."""
    import time

    from actors.driver import pool

    keeper = pool.keeper(create=False)
    if keeper is not None:
        ray_cluster.get(keeper.drain.remote())
    held = lambda: {
        k: v - ray_cluster.available_resources().get(k, 0)
        for k, v in ray_cluster.cluster_resources().items()
        if k in ("CPU", "GPU") and ray_cluster.available_resources().get(k, 0) < v
    }
    deadline = time.time() + 300
    while time.time() < deadline and held():
        time.sleep(0.05)
    assert not held(), f"resources still held by an earlier test's actors: {held()}"
    return ray_cluster

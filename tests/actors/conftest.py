"""One local Ray cluster for the whole session: 2 CPUs, 2 logical GPUs, a small object store."""

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=2,
        object_store_memory=200 * 1024**2,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()

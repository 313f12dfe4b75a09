"""Fractional GPU placement on logical GPUs, and the client actors a run asks for (`Resources`)."""

import pytest

from actors.driver.crew import create_client_actors
from rayfl.config import ConfigError
from rayfl.load import load_config

pytestmark = pytest.mark.ray


@pytest.mark.parametrize(
    "overrides, available, expected",
    [
        ([], {"CPU": 2.0}, 2),
        (["ray.cpus_per_actor=0.5"], {"CPU": 2.0}, 4),
        (["ray.cpus_per_actor=0.1", "ray.gpus_per_actor=0.25"], {"CPU": 2.0, "GPU": 2.0}, 8),
        (["ray.cpus_per_actor=0.1", "federation.clients_per_round=5"], {"CPU": 16.0}, 5),
        (["ray.num_actors=3"], {"CPU": 1.0}, 3),
    ],
)
def test_auto_actor_count(overrides, available, expected):
    assert load_config(None, overrides).resources.count(available) == expected


def test_no_room_is_a_clear_error():
    with pytest.raises(ConfigError, match="ray: no room for one client actor"):
        load_config(None, ["ray.gpus_per_actor=0.5"]).resources.count({"CPU": 2.0})


def test_eight_quarter_gpu_actors_run_on_two_gpus_and_a_ninth_waits(idle_cluster):
    ray = idle_cluster
    cfg = load_config(None, ["ray.cpus_per_actor=0.1", "ray.gpus_per_actor=0.25"])
    actors = create_client_actors(cfg, [f"placement-test-{k}" for k in range(9)], pooled=False)
    try:
        refs = [a.info.remote() for a in actors]
        ready, pending = ray.wait(refs, num_returns=8, timeout=600)  # 8 processes importing torch on busy cores
        assert len(ready) == 8
        ready, pending = ray.wait(refs, num_returns=9, timeout=3)
        assert len(ready) == 8 and len(pending) == 1  # the ninth cannot be placed
        infos = ray.get(ready)
        gpu_ids = sorted(i["gpu_ids"][0] for i in infos)
        assert gpu_ids == ["0"] * 4 + ["1"] * 4  # Ray packs one GPU before the next
        assert all(i["torch_threads"] == 1 and i["device"] == "cpu" for i in infos)  # no CUDA device here
        ray.kill(actors[refs.index(ready[0])])
        late, _ = ray.wait(pending, timeout=120)
        assert late == pending  # a freed slice lets the ninth start
    finally:
        for a in actors:
            ray.kill(a)

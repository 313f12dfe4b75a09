"""Virtual clock: hand-computed times, waiting, population dealing and seeding."""

from collections import Counter

import pytest

from rayfl.config import ConfigError
from rayfl.devices import DeviceProfile, Population, client_time, load_profile, round_duration

HAND = {
    "name": "hand",
    "mode_period": 0,
    "classes": [
        {"name": "slow", "proportion": 1, "flops": [1e9], "memory_mb": 64, "bandwidth_mbps": [8, 8]},
        {"name": "fast", "proportion": 1, "flops": [4e9], "memory_mb": 256, "bandwidth_mbps": [16, 16], "latency_ms": 10},
    ],
}


def test_round_time_and_waiting_of_a_hand_made_population():
    pop = Population(DeviceProfile.model_validate(HAND), num_clients=2, seed=0)
    by_name = {pop.state(k, 1).device: pop.state(k, 1) for k in range(2)}
    # Each client trains 2 GFLOP and moves 1 MB down and 1 MB up.
    slow = client_time(by_name["slow"], 2e9, 1_000_000, 1_000_000)
    fast = client_time(by_name["fast"], 2e9, 1_000_000, 1_000_000)
    # slow: 2e9 / 1e9 = 2 s compute; 16e6 bits / 8e6 b/s = 2 s comm -> 4 s
    assert (slow.compute_s, slow.comm_s, slow.total_s) == pytest.approx((2.0, 2.0, 4.0))
    # fast: 0.5 s compute; 16e6 / 16e6 = 1 s + 2 x 10 ms latency -> 1.52 s
    assert (fast.compute_s, fast.comm_s, fast.total_s) == pytest.approx((0.5, 1.02, 1.52))
    duration, waits = round_duration([slow.total_s, fast.total_s])
    assert duration == pytest.approx(4.0)
    assert waits == pytest.approx([0.0, 2.48])


def test_jetson_population_has_the_testbed_mix_and_a_100x_spread():
    profile = load_profile("jetson")
    pop = Population(profile, 80, seed=0)
    assert Counter(pop.device_class(k).name for k in range(80)) == {"tx2": 30, "nx": 40, "agx": 10}
    speeds = [f for c in profile.classes for f in c.flops]
    assert max(speeds) / min(speeds) == pytest.approx(100)
    assert all(1e6 <= pop.state(k, r).bandwidth_bps <= 30e6 for k in range(80) for r in range(1, 4))


def test_modes_change_only_every_mode_period_rounds_and_bandwidth_every_round():
    pop = Population(load_profile("jetson"), 80, seed=1)
    nx = [k for k in range(80) if pop.device_class(k).name == "nx"]
    same_epoch = all(pop.state(k, 20).flops == pop.state(k, 39).flops for k in nx)
    changed = sum(pop.state(k, 19).flops != pop.state(k, 20).flops for k in nx)
    assert same_epoch and changed > len(nx) // 2  # 8 modes: a re-draw keeps the mode 1/8 of the time
    assert sum(pop.state(k, 5).bandwidth_bps != pop.state(k, 6).bandwidth_bps for k in nx) == len(nx)


def test_same_seed_same_devices():
    a, b, c = (Population(load_profile("jetson"), 50, s) for s in (3, 3, 4))
    assert [a.state(k, 7) for k in range(50)] == [b.state(k, 7) for k in range(50)]
    assert [a.state(k, 7) for k in range(50)] != [c.state(k, 7) for k in range(50)]


def test_availability_is_seeded_per_round():
    profile = DeviceProfile.model_validate({**HAND, "classes": [{**HAND["classes"][0], "availability": 0.5}]})
    pop = Population(profile, 200, seed=0)
    online = pop.available(3)
    assert 60 < len(online) < 140 and online == pop.available(3) and online != pop.available(4)


def test_profile_errors_name_the_file_and_key(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nclasses:\n  - {name: a, proportion: 1, flops: [1.0e9], memory_mb: 1, bandwidth_mbps: [5, 1]}\n")
    with pytest.raises(ConfigError, match="mine.yaml: classes.0: .*bandwidth_mbps"):
        load_profile(str(path))
    with pytest.raises(ConfigError, match="devices.profile: 'nowhere' is neither"):
        load_profile("nowhere")

"""Virtual clock: hand-computed times, waiting, population dealing and seeding."""

from collections import Counter

import numpy as np
import pytest

from rayfl.config import ConfigError
from rayfl.devices import DeviceProfile, Population, client_time, load_profile, round_duration, with_mix
from rayfl.load import parse_config

HAND = {
    "name": "hand",
    "mode_period": 0,
    "classes": [
        {"name": "slow", "proportion": 1, "flops": [1e9], "memory_mb": 64, "bandwidth_mbps": [8, 8]},
        {
            "name": "fast",
            "proportion": 1,
            "flops": [4e9],
            "memory_mb": 256,
            "bandwidth_mbps": [16, 16],
            "latency_ms": 10,
        },
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
    assert all(
        1e6 <= pop.state(k, r).down_bps == pop.state(k, r).up_bps <= 30e6 for k in range(80) for r in range(1, 4)
    )


def test_modes_change_only_every_mode_period_rounds():
    pop = Population(load_profile("jetson"), 80, seed=1)
    nx = [k for k in range(80) if pop.device_class(k).name == "nx"]
    same_epoch = all(pop.state(k, 20).flops == pop.state(k, 39).flops for k in nx)
    changed = sum(pop.state(k, 19).flops != pop.state(k, 20).flops for k in nx)
    assert same_epoch and changed > len(nx) // 2  # 8 modes: a re-draw keeps the mode 1/8 of the time


def _bandwidth_correlation(jitter: float | None) -> tuple[float, np.ndarray]:
    """Across 200 clients: the correlation of round 5's and round 6's link speeds, and all of rounds 0-9."""
    cls = {**HAND["classes"][0], "bandwidth_mbps": [1, 30], "bandwidth_jitter": jitter}
    pop = Population(DeviceProfile.model_validate({**HAND, "classes": [cls]}), 200, seed=2)
    mbps = np.array([[pop.state(k, r).down_bps / 1e6 for r in range(10)] for k in range(200)])
    return float(np.corrcoef(mbps[:, 5], mbps[:, 6])[0, 1]), mbps


def test_bandwidth_is_redrawn_every_round_without_jitter():
    corr, mbps = _bandwidth_correlation(None)
    assert abs(corr) < 0.2 and (mbps[:, 5] != mbps[:, 6]).all()
    assert mbps.min() >= 1 and mbps.max() <= 30


def test_bandwidth_jitter_keeps_each_clients_level():
    # levels ~ U[1, 30] (sd 8.4) against a 20% jitter (sd ~3.1 at the mean level 15.5): corr ~ 0.88
    corr, mbps = _bandwidth_correlation(0.2)
    assert corr > 0.8 and (mbps[:, 5] != mbps[:, 6]).mean() > 0.9
    assert mbps.min() >= 1 and mbps.max() <= 30


def test_same_seed_same_devices():
    a, b, c = (Population(load_profile("jetson"), 50, s) for s in (3, 3, 4))
    assert [a.state(k, 7) for k in range(50)] == [b.state(k, 7) for k in range(50)]
    assert [a.state(k, 7) for k in range(50)] != [c.state(k, 7) for k in range(50)]


def test_availability_is_seeded_per_round():
    profile = DeviceProfile.model_validate({**HAND, "classes": [{**HAND["classes"][0], "availability": 0.5}]})
    pop = Population(profile, 200, seed=0)
    online = pop.available(3)
    assert (
        60 < len(online) < 140
        and online.tolist() == pop.available(3).tolist()
        and online.tolist() != pop.available(4).tolist()
    )
    # Online, a client stays so through the round: it never drops mid-task.
    assert all(pop.until(c, 3, 0.0, 1e9) == float("inf") for c in online)


def test_profile_errors_name_the_file_and_key(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "name: mine\nclasses:\n  - {name: a, proportion: 1, flops: [1.0e9], memory_mb: 1, bandwidth_mbps: [5, 1]}\n"
    )
    with pytest.raises(ConfigError, match="mine.yaml: classes.0: .*bandwidth_mbps"):
        load_profile(str(path))
    with pytest.raises(ConfigError, match="devices.profile: 'nowhere' is neither"):
        load_profile("nowhere")


def test_a_mix_replaces_the_class_proportions_and_drops_zero_classes():
    jetson = load_profile("jetson")  # tx2 : nx : agx = 3 : 4 : 1
    pop = Population(with_mix(jetson, "1:2:7"), 40, seed=0)
    # 40 x (0.1, 0.2, 0.7) = 4, 8, 28 exactly
    assert Counter(pop.device_class(k).name for k in range(40)) == {"tx2": 4, "nx": 8, "agx": 28}
    pop = Population(with_mix(jetson, "0:1:1"), 10, seed=0)
    assert Counter(pop.device_class(k).name for k in range(10)) == {"nx": 5, "agx": 5}
    assert with_mix(jetson, None) is jetson


def test_a_mix_of_the_wrong_length_or_shape_names_the_field():
    with pytest.raises(
        ConfigError, match=r"devices.mix: '1:1' has 2 numbers; profile 'jetson' has 3 classes \(tx2:nx:agx\)"
    ):
        with_mix(load_profile("jetson"), "1:1")
    with pytest.raises(ConfigError, match="devices.mix: .*'1:x:2'"):
        parse_config({"devices": {"mix": "1:x:2"}})

"""Clients that go offline mid-task, declines for the battery, and energy: hand checks on the
virtual clock, and resumed runs with dropouts and a changing population equal uninterrupted ones."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rayfl import checkpoint, rng
from rayfl.devices.trace import write_trace
from rayfl.load import load_config
from rayfl.runner import run_local

BASE = ["model.name=mlp", "metrics.tensorboard=false", "federation.checkpoint_every=0"]
PHONES = str(Path(__file__).parent / "devices" / "phones.yaml")


def one_device_trace(folder, intervals, battery=np.nan, flops=(1e6,)):
    """Devices of `flops` FLOP/s over 1 MB/s links (no latency), 0.1 J/GFLOP and 2 J/MB."""
    d = pd.DataFrame(
        {
            "device_id": np.arange(len(flops)),
            "flops_per_s": flops,
            "up_bps": 8e6,
            "down_bps": 8e6,
            "memory_bytes": 2**30,
            "energy_j_per_gflop": 0.1,
            "energy_j_per_mb": 2.0,
            "battery_j": battery,
            "period_s": 1e9,
        }
    )
    iv = pd.DataFrame(intervals, columns=["device_id", "online_from_s", "online_to_s"])
    return write_trace(d, iv, folder)


def run(tmp_path, name, trace, *sets):
    cfg = load_config(None, [*BASE, f"devices.trace={trace}", "devices.availability.kind=trace", *sets])
    run_local(cfg, tmp_path / name)
    return pd.read_parquet(tmp_path / name / "metrics.parquet"), pd.read_parquet(tmp_path / name / "clients.parquet")


def test_a_device_whose_interval_ends_mid_task_drops_then_with_what_it_spent(tmp_path):
    sets = ["data.num_clients=5", "federation.clients_per_round=1", "federation.rounds=1"]
    _, full = run(tmp_path, "full", one_device_trace(tmp_path / "always", [(0, 0.0, 1e8)]), *sets)
    (row,) = full.itertuples()
    f, down, up = row.flops, row.bytes_down, row.bytes_up
    # Online: download bytes / 1 MB/s, compute f / 1 MFLOP/s, upload; energy f x 0.1 J/GFLOP + bytes x 2 J/MB.
    assert row.total_s == pytest.approx(down / 1e6 + f / 1e6 + up / 1e6)
    assert row.energy_j == pytest.approx(f / 1e9 * 0.1 + (down + up) / 1e6 * 2.0)
    # Offline halfway through its compute: it drops there, charged its download and half the FLOPs.
    cut = down / 1e6 + 0.5 * f / 1e6
    metrics, clients = run(tmp_path, "cut", one_device_trace(tmp_path / "cut", [(0, 0.0, cut)]), *sets)
    (row,) = clients.itertuples()
    assert (
        row.status == "dropped" and row.total_s == pytest.approx(cut) and row.compute_s == pytest.approx(0.5 * f / 1e6)
    )
    assert (row.bytes_down, row.bytes_up) == (down, 0) and row.flops == pytest.approx(0.5 * f)
    assert row.energy_j == pytest.approx(0.5 * f / 1e9 * 0.1 + down / 1e6 * 2.0)
    m = metrics.iloc[0]
    assert (m.num_clients, m.num_dropped, m.virtual_time_s) == (
        0,
        1,
        pytest.approx(cut),
    ) and m.energy_j == pytest.approx(row.energy_j)
    assert np.isnan(m.train_loss)  # a round with no update is still a round


def battery_trace(tmp_path):
    """Client a's device has a battery of 1.5 tasks; client b's has none and, 10x slower, sets each
    round's length D. a goes offline at 1.5 D and back at 1.8 D. The trace, the settings (both
    clients every round, 3 rounds), a's energy a task and D."""
    seed = next(s for s in range(50) if rng.generator(s, "trace-device").integers(2, size=2).tolist() == [0, 1])
    sets = [f"seed={seed}", "data.num_clients=2", "federation.clients_per_round=2", "federation.rounds=3"]
    _, probe = run(
        tmp_path, "probe", one_device_trace(tmp_path / "probe", [(0, 0.0, 1e8), (1, 0.0, 1e8)], flops=(1e6, 1e5)), *sets
    )
    first = probe[probe["round"] == 1].set_index("client_id")
    energy, length = first.loc[0, "energy_j"], first.loc[1, "total_s"]
    assert first.loc[0, "total_s"] < length
    trace = tmp_path / "battery"
    one_device_trace(trace, [(0, 0.0, 1.5 * length), (0, 1.8 * length, 1e8), (1, 0.0, 1e8)], flops=(1e6, 1e5))
    frame = pd.read_parquet(trace / "devices.parquet").assign(battery_j=[1.5 * energy, np.nan])
    frame.to_parquet(trace / "devices.parquet", index=False)
    return trace, sets, energy, length


def test_a_low_battery_declines_and_a_charge_while_offline_restores_it(tmp_path):
    # Round 1 at 0: a trains (0.5 task left). Round 2 at D: a declines. Round 3 at 2 D finds it
    # recharged (offline from 1.5 D to 1.8 D), and it trains.
    trace, sets, energy, length = battery_trace(tmp_path)
    metrics, clients = run(tmp_path, "run", trace, *sets)
    a = clients[clients["client_id"] == 0].set_index("round")
    assert a["status"].tolist() == ["ok", "skipped", "ok"]
    assert a.loc[2, "reason"] == f"battery: the task needs {energy:.1f} J, {0.5 * energy:.1f} J left"
    assert np.isnan(a.loc[2, "energy_j"]) and a.loc[3, "energy_j"] == pytest.approx(energy)
    assert metrics["virtual_time_s"].tolist() == pytest.approx([length, 2 * length, 3 * length])
    assert metrics["energy_j"].sum() == pytest.approx(clients["energy_j"].sum())


def test_a_run_handed_over_at_a_round_boundary_keeps_every_batterys_charge(tmp_path):
    # The hand-over of a run begun in the driver (`ray.start_in_process`): paused after round 1, it
    # continues from what a checkpoint of that round holds. a's charge (half a task) must travel
    # with it, so a still declines in round 2, as in the run that never paused.
    from rayfl.engine import Paused, prepare, run_federation, torch_threads
    from rayfl.runner import InProcessExecutor

    trace, sets, _, _ = battery_trace(tmp_path)
    cfg = load_config(None, [*BASE, f"devices.trace={trace}", "devices.availability.kind=trace", *sets])
    run_local(cfg, tmp_path / "whole")
    fed, start = prepare(cfg, tmp_path / "moved")
    with torch_threads():
        with pytest.raises(Paused) as paused:
            run_federation(fed, InProcessExecutor(fed), tmp_path / "moved", start, pause=lambda r: r == 1)
        run_federation(fed, InProcessExecutor(fed), tmp_path / "moved", paused.value.start)
    for name in ("metrics.parquet", "clients.parquet"):
        whole, moved = (
            pd.read_parquet(tmp_path / d / name).drop(columns="wall_time_s", errors="ignore")
            for d in ("whole", "moved")
        )
        pd.testing.assert_frame_equal(moved, whole)
    clients = pd.read_parquet(tmp_path / "moved" / "clients.parquet")
    assert clients[clients["client_id"] == 0]["status"].tolist() == ["ok", "skipped", "ok"]


DEVICES = [
    f"devices.profile={PHONES}",
    "devices.availability.kind=diurnal",
    "devices.availability.session_s=120",
    "devices.availability.slot_s=10",
    "devices.availability.on_fraction=0.5",
    "devices.population.initial=20",
    "devices.population.arrivals_per_hour=300",
    "devices.population.departures_per_hour=300",
    "model.name=mlp",
    "data.num_clients=30",
    "metrics.tensorboard=false",
]


@pytest.mark.parametrize(
    "sets",
    [
        ["federation.mode=sync"],
        ["federation.mode=async", "federation.async.concurrency=6", "federation.async.buffer_size=4"],
    ],
    ids=["sync", "fedbuff"],
)
def test_a_resumed_run_with_dropouts_and_a_changing_population_equals_an_uninterrupted_one(tmp_path, sets):
    base = [*DEVICES, *sets, "federation.checkpoint_every=2"]
    run_local(load_config(None, [*base, "federation.rounds=5"]), tmp_path / "straight")
    broken = tmp_path / "broken"
    run_local(load_config(None, [*base, "federation.rounds=3"]), broken)
    (broken / "checkpoints" / "round_00003.pt").unlink()
    assert checkpoint.latest(broken).batteries.levels  # devices had spent charge when it was written
    run_local(load_config(broken / "config.yaml", ["federation.rounds=5"]), broken, resume=True)
    straight = [pd.read_parquet(tmp_path / "straight" / f) for f in ("metrics.parquet", "clients.parquet")]
    for a, name in zip(straight, ("metrics.parquet", "clients.parquet")):
        b = pd.read_parquet(broken / name)
        cols = [c for c in a.columns if c != "wall_time_s"]
        pd.testing.assert_frame_equal(a[cols], b[cols])
    statuses = set(straight[1]["status"])
    assert {"dropped", "skipped"} <= statuses and straight[0]["population"].nunique() > 1

"""Device traces: the generator, validation before anything starts, and FedScale's files imported
by an unpickler that runs nothing."""

import pickle
import re

import numpy as np
import pandas as pd
import pytest

from rayfl.cli import main
from rayfl.devices.fedscale import REFERENCE_FLOPS
from rayfl.devices.trace import generate_trace, load_trace, write_trace


def test_a_generated_trace_is_heavy_tailed_diurnal_and_valid(tmp_path):
    assert main(["traces", "generate", "--devices", "400", "--days", "2", "--out", str(tmp_path / "t")]) == 0
    trace = load_trace(tmp_path / "t", need_intervals=True)
    d, iv = trace.devices, trace.intervals
    speed = d["flops_per_s"]
    assert speed.quantile(0.95) / speed.quantile(0.05) > 10  # log-normal over device models, sigma 1
    assert (d.groupby("network")["down_bps"].median().sort_values().index.tolist()) == ["3g", "lte", "wifi"]
    online = (iv["online_to_s"] - iv["online_from_s"]).sum() / (400 * 2 * 86400)
    assert online == pytest.approx(0.3, abs=0.02)
    assert np.array_equal(trace.periods(), np.full(400, 2 * 86400.0))


def write(tmp_path, devices=None, intervals=None):
    d, iv = generate_trace(5, days=1)
    return write_trace(
        devices if devices is not None else d, intervals if intervals is not None else iv, tmp_path / "bad"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d, iv: (d.drop(columns="up_bps"), iv), "devices.parquet: missing column up_bps"),
        (
            lambda d, iv: (d.assign(flops_per_s=d["flops_per_s"] * [1, 1, -1, 1, 1]), iv),
            "devices.parquet: column flops_per_s: .* for device_id 2 .must be a finite number > 0",
        ),
        (
            lambda d, iv: (d, iv.assign(online_to_s=iv["online_from_s"] - 1)),
            "intervals.parquet: column online_to_s: .*an interval must end after it starts",
        ),
        (
            lambda d, iv: (d, iv.assign(device_id=iv["device_id"] + 100)),
            "intervals.parquet: column device_id: .*not in devices.parquet",
        ),
    ],
    ids=["missing-column", "negative-speed", "interval-backwards", "unknown-device"],
)
def test_a_bad_trace_is_one_line_exit_2_before_anything_is_written(tmp_path, capsys, change, message):
    trace = write(tmp_path, *change(*generate_trace(5, days=1)))
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--local",
            "--set",
            f"devices.trace={trace}",
            "--set",
            "devices.availability.kind=trace",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and not out.exists()
    assert re.search(message, err), err


def test_an_unknown_availability_kind_is_refused_naming_the_key(capsys):
    assert main(["run", "--local", "--set", "devices.availability.kind=weekly"]) == 2
    assert "devices.availability" in capsys.readouterr().err


def fedscale_files(tmp_path):
    # FedScale's structure: {client_id: {'computation': ms per sample, 'communication': kbit/s}}
    # and {client_id: {'active': [...], 'inactive': [...], 'finish_time': s, 'duration', 'model'}}.
    capacity = {
        1: {"computation": 50.0, "communication": 5648.1},
        2: {"computation": 162.0, "communication": 800.0},
        3: {"computation": 20.0, "communication": 20000.0},
    }
    behave = {
        107: {
            "duration": 300,
            "inactive": [200, 1000],
            "finish_time": 86400,
            "active": [100, 800],
            "model": "SM-G611MT",
        },
        9: {"duration": 50, "inactive": [60], "finish_time": 172800, "active": [10], "model": "CPH1801"},
    }
    paths = tmp_path / "client_device_capacity", tmp_path / "client_behave_trace"
    for path, data in zip(paths, (capacity, behave)):
        path.write_bytes(pickle.dumps(data))
    return capacity, behave, paths


def test_fedscale_files_convert_to_the_trace_format_and_back_to_the_same_numbers(tmp_path):
    capacity, behave, (cap, beh) = fedscale_files(tmp_path)
    assert main(["traces", "import-fedscale", str(cap), str(beh), "--out", str(tmp_path / "t")]) == 0
    trace = load_trace(tmp_path / "t", need_intervals=True)
    d = trace.devices.set_index("device_id")
    # Back: computation = reference FLOPs / FLOP/s in ms; communication = bits/s / 1024.
    for cid, entry in capacity.items():
        assert REFERENCE_FLOPS / d.loc[cid, "flops_per_s"] * 1000 == pytest.approx(entry["computation"], rel=1e-12)
        assert (
            d.loc[cid, "up_bps"] / 1024
            == d.loc[cid, "down_bps"] / 1024
            == pytest.approx(entry["communication"], rel=1e-12)
        )
    # Device i takes the behaviour of the (i mod 2)-th client: 1 -> 107, 2 -> 9, 3 -> 107.
    keys = list(behave)
    for i, cid in enumerate(capacity):
        b = behave[keys[i % 2]]
        got = trace.intervals[trace.intervals["device_id"] == cid]
        assert list(zip(got["online_from_s"], got["online_to_s"])) == list(zip(b["active"], b["inactive"]))
        assert d.loc[cid, "period_s"] == b["finish_time"]
    assert d["battery_j"].isna().all()


class Payload:
    """Pickling this object makes the unpickler call `open(PATH, "w")`: a file appears if it runs."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize("payload", ["reduce", "class"])
def test_a_pickle_holding_any_other_object_is_refused_and_runs_nothing(tmp_path, capsys, payload):
    _, _, (cap, beh) = fedscale_files(tmp_path)
    marker = tmp_path / "pwned"
    obj = Payload(marker) if payload == "reduce" else {1: {"computation": np.float64(3.0), "communication": 1.0}}
    cap.write_bytes(pickle.dumps({1: obj} if payload == "reduce" else obj))
    out = tmp_path / "t"
    assert main(["traces", "import-fedscale", str(cap), str(beh), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refused" in err and str(cap) in err
    assert not marker.exists() and not out.exists()
    # The same bytes through pickle itself would have run the payload: the test's payload is live.
    if payload == "reduce":
        pickle.loads(cap.read_bytes())
        assert marker.exists()


def test_fedscale_keys_must_be_whole_numbers(tmp_path, capsys):
    _, _, (cap, beh) = fedscale_files(tmp_path)
    cap.write_bytes(pickle.dumps({"a": {"computation": 1.0, "communication": 1.0}}))
    assert main(["traces", "import-fedscale", str(cap), str(beh), "--out", str(tmp_path / "t")]) == 2
    assert "client 'a'" in capsys.readouterr().err


def test_a_trace_runs_with_its_devices_and_intervals(tmp_path):
    d, iv = generate_trace(50, days=1)
    write_trace(d, iv, tmp_path / "t")
    assert (
        main(
            [
                "run",
                "--local",
                "--set",
                f"devices.trace={tmp_path / 't'}",
                "--set",
                "devices.availability.kind=trace",
                "--set",
                "federation.rounds=2",
                "--set",
                "metrics.tensorboard=false",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 0
    )
    clients = pd.read_parquet(tmp_path / "run" / "clients.parquet")
    by_id = d.set_index("device_id")
    dev = clients["device"].str.removeprefix("trace:").astype(int)
    assert np.allclose(clients["device_flops"], by_id.loc[dev, "flops_per_s"].to_numpy())
    assert np.allclose(clients["upload_mbps"], by_id.loc[dev, "up_bps"].to_numpy() / 1e6)


def test_a_trace_brings_its_own_availability_unless_the_config_names_one(tmp_path):
    from rayfl.load import load_config

    write_trace(*generate_trace(20, seed=0, days=1), tmp_path / "t")
    assert load_config(None, [f"devices.trace={tmp_path / 't'}"]).devices.availability.kind == "trace"
    named = load_config(None, [f"devices.trace={tmp_path / 't'}", "devices.availability.kind=bernoulli"])
    assert named.devices.availability.kind == "bernoulli"
    (tmp_path / "t" / "intervals.parquet").unlink()  # a trace of devices only: always online, as before
    assert load_config(None, [f"devices.trace={tmp_path / 't'}"]).devices.availability.kind == "bernoulli"

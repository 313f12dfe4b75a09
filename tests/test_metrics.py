"""Recorder: contract columns, summary keys, time to a target accuracy."""

import math

from rayfl.metrics import METRICS_COLUMNS, SUMMARY_KEYS, Recorder


def row(r, acc, vt):
    return {
        "round": r,
        "virtual_time_s": vt,
        "wall_time_s": 0.1 * r,
        "test_accuracy": acc,
        "test_loss": 1.0,
        "bytes_up": 10,
        "bytes_down": 20,
        "num_clients": 2,
        "mean_wait_s": 0.5,
    }


def test_summary_and_time_to_target(tmp_path):
    rec = Recorder(tmp_path)
    for r, acc, vt in ((1, 0.4, 10.0), (2, math.nan, 25.0), (3, 0.8, 40.0), (4, 0.7, 55.0)):
        rec.record(row(r, acc, vt), [{"round": r, "client_id": 0}])
    summary = rec.summary("fedavg", target=0.75)
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["final_test_accuracy"] == 0.7 and summary["best_test_accuracy"] == 0.8
    assert summary["bytes_total"] == 4 * 30 and summary["time_to_target_s"] == 40.0
    assert rec.summary("fedavg", target=0.9)["time_to_target_s"] is None
    assert list(rec.metrics_frame().columns[: len(METRICS_COLUMNS)]) == list(METRICS_COLUMNS)


def test_a_write_killed_midway_keeps_the_last_complete_table(tmp_path, monkeypatch):
    import os

    import pandas as pd
    import pytest

    from rayfl import storage

    rec = Recorder(tmp_path)
    rec.record(row(1, 0.4, 10.0), [{"round": 1, "client_id": 0}])

    class Killed(BaseException):
        pass

    def killed(src, dst, real=os.replace):  # the new table written in full aside, the process killed before the rename
        if str(dst).endswith("metrics.parquet"):
            raise Killed
        real(src, dst)

    monkeypatch.setattr(storage.os, "replace", killed)
    with pytest.raises(Killed):
        rec.record(row(2, 0.5, 20.0), [{"round": 2, "client_id": 0}])
    monkeypatch.undo()
    assert pd.read_parquet(tmp_path / "metrics.parquet")["round"].tolist() == [1]
    (aside,) = tmp_path.glob(".metrics.parquet.*.tmp")
    assert pd.read_parquet(aside)["round"].tolist() == [1, 2]  # left aside, never read
    rec.record(row(3, 0.6, 30.0), [{"round": 3, "client_id": 0}])
    assert pd.read_parquet(tmp_path / "clients.parquet")["round"].tolist() == [1, 2, 3]


def test_a_recorder_writes_where_it_was_made_whatever_the_working_directory(tmp_path, monkeypatch):
    # `rayfl run --out runs/x` on Ray: the recorder is made in the driver and writes in the
    # coordinator actor, whose working directory need not be the driver's
    monkeypatch.chdir(tmp_path)
    rec = Recorder("runs/x")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    rec.record({"round": 1, "test_accuracy": 0.5}, [{"round": 1, "client_id": 0}])
    assert (tmp_path / "runs" / "x" / "metrics.parquet").is_file()
    assert not (tmp_path / "elsewhere" / "runs").exists()


def test_tensorboard_events_equal_the_metrics_table_and_a_resume_purges_what_it_recomputes(tmp_path, monkeypatch):
    import numpy as np
    import pandas as pd
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rayfl.load import parse_config
    from rayfl.runner import run_local

    raw = {"algorithm": {"name": "heterofl", "levels": "a1-e1"}, "model": {"name": "mlp"}, "data": {"num_clients": 4}}
    raw["federation"] = {"clients_per_round": 2, "rounds": 3, "checkpoint_every": 2, "local_epochs": 1}
    import types

    import tensorboardX.event_file_writer

    # Both event files made in the same second (their names carry it): the resume must not overwrite the first.
    monkeypatch.setattr(tensorboardX.event_file_writer, "time", types.SimpleNamespace(time=lambda: 1_800_000_000.0))
    run_local(parse_config(raw), tmp_path)
    (tmp_path / "checkpoints" / "round_00003.pt").unlink()  # as if stopped after round 2's checkpoint
    run_local(parse_config(raw), tmp_path, resume=True)  # recomputes round 3

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    metrics = pd.read_parquet(tmp_path / "metrics.parquet")
    tags = events.Tags()["scalars"]
    assert {"test_accuracy", "test_accuracy/a", "test_accuracy/e", "virtual_time_s", "bytes_up", "train_loss"} <= set(
        tags
    )
    for tag in tags:
        column = metrics[tag.replace("/", "@")].dropna()
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == metrics.loc[column.index, "round"].tolist(), tag  # once per round
        assert np.array_equal(np.float32([s.value for s in scalars]), column.to_numpy(np.float32)), tag
    assert "wall_time_s" in tags and "round" not in tags
    (config,) = [t for t in events.Tags()["tensors"] if t.startswith("config")]
    assert "name: heterofl" in events.Tensors(config)[-1].tensor_proto.string_val[0].decode()

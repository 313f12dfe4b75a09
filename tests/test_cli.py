"""The command line: exit codes, one-line errors, a tiny run, plots."""

import json
import subprocess
import sys

import pytest


def rayfl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rayfl", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--set", "federation.rounds=0"], "federation.rounds: Input should be greater than or equal to 1"),
        (["run", "--set", "algorithm.beta=0.2"], "algorithm.beta: unknown key"),
        (["run", "missing.yaml"], "missing.yaml: no such file"),
        (["run", "--set", "devices.profile=nowhere.yaml"], "devices.profile: 'nowhere.yaml' is neither"),
        (["plot", "not-a-run"], "not-a-run: no metrics.parquet"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    out = rayfl(*args, cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rayfl: error: {message}"), out.stderr


def test_run_list_and_plot(tmp_path):
    run_dir = tmp_path / "run"
    out = rayfl("run", "--local", "--set", "federation.rounds=2", "--set", "model.name=mlp", "--out", str(run_dir), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2
    listing = rayfl("list").stdout
    for name in ("fedavg", "fedprox", "fedadam", "digits", "mnist1d", "synthetic", "cnn", "jetson", "mobile", "uniform"):
        assert f"  {name} " in listing
    plot = rayfl("plot", str(run_dir), "--out", str(tmp_path / "plots"))
    assert plot.returncode == 0, plot.stderr
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["accuracy_vs_round.png", "accuracy_vs_virtual_time.png"]
    assert all((tmp_path / "plots" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_resume_extends_a_run_in_place(tmp_path):
    run_dir = tmp_path / "run"
    first = rayfl("run", "--local", "--set", "federation.rounds=2", "--set", "model.name=mlp", "--out", str(run_dir))
    assert first.returncode == 0, first.stderr
    again = rayfl("run", "--local", "--resume", str(run_dir), "--set", "federation.rounds=3")
    assert again.returncode == 0, again.stderr
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 3
    both = rayfl("run", "cfg.yaml", "--resume", str(run_dir), cwd=tmp_path)
    assert both.returncode == 2 and "takes the run's own config.yaml" in both.stderr

"""The command line: exit codes, one-line errors, a tiny run, its comparison."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rayfl import checkpoint
from rayfl.cli import main
from rayfl.config import ConfigError
from rayfl.load import load_config
from rayfl.runner import run_local
from rayfl.storage import dump_config

ROOT = Path(__file__).resolve().parent.parent


def rayfl(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rayfl", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--set", "federation.rounds=0"], "federation.rounds: Input should be greater than or equal to 1"),
        (["run", "--set", "algorithm.beta=0.2"], "algorithm.beta: unknown key"),
        (["run", "missing.yaml"], "missing.yaml: no such file"),
        (["run", "--set", "devices.profile=nowhere.yaml"], "devices.profile: 'nowhere.yaml' is neither"),
        (["compare", "not-a-run"], "not-a-run: no metrics.parquet"),
        # an abbreviation must not reach the hidden --config-env (it once ended in an AttributeError)
        (["run", "--config", "cfg.yaml"], "unrecognized arguments: --config"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, args, message):
    out = rayfl(*args, cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rayfl: error: {message}"), out.stderr


def test_run_list_and_compare(tmp_path):
    run_dir = tmp_path / "run"
    out = rayfl(
        "run", "--local", "--set", "federation.rounds=2", "--set", "model.name=mlp", "--out", str(run_dir), cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2
    listing = rayfl("list").stdout
    for name in (
        "fedavg",
        "fedprox",
        "fedadam",
        "digits",
        "mnist1d",
        "synthetic",
        "cnn",
        "jetson",
        "mobile",
        "uniform",
    ):
        assert f"  {name} " in listing
    assert any((run_dir / "tb").iterdir())  # TensorBoard events, on by default
    compare = rayfl("compare", str(run_dir), "--out", str(tmp_path / "cmp"))
    assert compare.returncode == 0, compare.stderr
    pngs = sorted(p.name for p in (tmp_path / "cmp").glob("*.png"))
    assert pngs == ["accuracy_vs_bytes.png", "accuracy_vs_round.png", "accuracy_vs_virtual_time.png"]
    assert all((tmp_path / "cmp" / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_resume_extends_a_run_in_place(tmp_path):
    run_dir = tmp_path / "run"
    first = rayfl("run", "--local", "--set", "federation.rounds=2", "--set", "model.name=mlp", "--out", str(run_dir))
    assert first.returncode == 0, first.stderr
    again = rayfl("run", "--local", "--resume", str(run_dir), "--set", "federation.rounds=3")
    assert again.returncode == 0, again.stderr
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 3
    both = rayfl("run", "cfg.yaml", "--resume", str(run_dir), cwd=tmp_path)
    assert both.returncode == 2 and "takes the run's own config.yaml" in both.stderr
    other = rayfl("run", "--local", "--resume", str(run_dir), "--set", "algorithm.name=heterofl")
    assert other.returncode == 2 and other.stderr.splitlines() == [
        "rayfl: error: algorithm.name: a resumed run keeps its own (fedavg); --resume changes only federation.rounds, "
        "federation.checkpoint_every, federation.target_accuracy, ray.*, metrics.*: start a new run for heterofl"
    ]


def test_a_folder_that_holds_a_run_is_never_replaced_without_asking(tmp_path):
    run_dir = tmp_path / "run"
    small = ["--local", "--set", "federation.rounds=1", "--set", "model.name=mlp", "--out", str(run_dir)]
    assert rayfl("run", *small).returncode == 0
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    again = rayfl("run", *small, "--set", "seed=1")
    assert again.returncode == 2 and again.stderr.splitlines() == [
        f"rayfl: error: --out {run_dir}: holds a run; continue it with --resume {run_dir}, or replace it with "
        "--overwrite"
    ]
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before  # nothing written
    assert rayfl("run", *small, "--set", "seed=1", "--overwrite").returncode == 0
    assert "seed: 1" in (run_dir / "config.yaml").read_text()


# Every bad input of docs/cli.md's list: exit 2, one line naming the key or file, nothing written,
# on Ray and with --local alike (all are found before a cluster would start).
BAD_INPUTS = [
    (["--set", "federation.bogus=1"], "federation.bogus: unknown key"),
    (["--set", "federation.lr=0"], "federation.lr: Input should be greater than 0"),
    (["--set", "algorithm.name=nope"], "algorithm.name: unknown algorithm 'nope'"),
    (["--set", "algorithm.beta=0.2"], "algorithm.beta: unknown key"),
    (["--set", "data.name=synthetic"], "model.name: cnn needs image (C, H, W) input"),
    (["missing.yaml"], "missing.yaml: no such file"),
    (["bad.yaml"], "bad.yaml: line 3 invalid YAML"),
    (["--set", "devices.profile=nowhere.yaml"], "devices.profile: 'nowhere.yaml' is neither"),
    (["--set", "devices.mix=1:2"], "devices.mix: '1:2' has 2 numbers; profile 'jetson' has 3 classes"),
    (["--set", "data.name=cifar10", "--set", "data.data_dir=."], "data.data_dir: cifar10 not found under"),
    (["--set", "data.partition.min_size=500"], "data.num_clients: 20 clients x data.partition.min_size 500 exceeds"),
    (["--set", "federation.clients_per_round=30"], "federation.clients_per_round (30) exceeds data.num_clients (20)"),
    (["--set", "algorithm.name=sfl", "--set", "model.name=mlp"], "model.name: sfl needs a model with a split point"),
    (
        ["--set", "algorithm.name=sfl", "--set", "federation.local_epochs=2"],
        "federation.local_epochs: sfl trains algorithm.tau iterations",
    ),
    (
        ["--set", "federation.optimizer=adam", "--set", "federation.momentum=0.9"],
        "federation.momentum: Value error, applies to optimizer sgd only",
    ),
    (["--set", "federation.lr_schedule={kind: multistep, milestones: [0.5, 3]}"], "federation.lr_schedule.milestones:"),
    (["dup.yaml"], "dup.yaml: line 3 duplicate key 'federation'"),
    (["folder"], "folder: is a directory, not a YAML file"),
    (["--out", "/proc/rayfl-nowhere/run"], "/proc/rayfl-nowhere/run: cannot create it under /proc"),
    (["--out", "a-file"], "a-file: exists and is not a directory"),
    (["--resume", "fresh"], "--resume fresh: no checkpoint under fresh/checkpoints"),
    (["--resume", "corrupt"], "--resume corrupt: no readable checkpoint"),
    (["--resume", "nothing-here"], "nothing-here/config.yaml: no such file"),
    (["cfg.yaml", "--resume", "done"], "--resume done: takes the run's own config.yaml"),
    (["--resume", "done", "--set", "federation.lr=0.1"], "federation.lr: a resumed run keeps its own (0.05); --resume"),
    (
        ["--resume", "adam-checkpoints"],
        "--resume adam-checkpoints: config.yaml does not belong to round_00002.pt: algorithm.name is fedavg there, "
        "fedadam in the checkpoint",
    ),
    (
        ["--resume", "heterofl-config"],
        "--resume heterofl-config: config.yaml does not belong to round_00002.pt: algorithm.name is heterofl there, "
        "fedavg in the checkpoint",
    ),
    (
        ["--resume", "far-round"],
        "--resume far-round: round_1000000000000.pt is at round 1000000000000, beyond federation.rounds 2",
    ),
    (["--resume", "misnamed"], "--resume misnamed: round_00009.pt holds round 2, not the one its name says"),
    (["--resume", "nan"], "--resume nan: round_00002.pt holds NaN or infinite values at state.weights['1.bias']"),
    (
        ["--resume", "reshaped"],
        "--resume reshaped: round_00002.pt's weights do not fit the model at 1.bias (checkpoint float32 (3,), "
        "model float32 (200,))",
    ),
    (["--resume", "unsigned"], "--resume unsigned: round_00002.pt does not say which run wrote it"),
    (["--resume", "short-table"], "--resume short-table: metrics.parquet does not hold one row for each of rounds"),
    (
        ["--set", "federation.mode=deadline", "--set", "federation.deadline.deadline_s=-5"],
        "federation.deadline.deadline_s: Input should be greater than 0",
    ),
    (
        ["--set", "federation.mode=deadline", "--set", "federation.deadline.min_reports=11"],
        "federation.deadline.min_reports (11) exceeds K = 10, the updates that close a round: every round would be "
        "abandoned",
    ),
    (
        ["--set", "federation.mode=async", "--set", "federation.async.buffer_size=11"],
        "federation.async.buffer_size (11) exceeds the clients in flight, federation.async.concurrency (10)",
    ),
    (
        ["--set", "federation.mode=async", "--set", "algorithm.name=sfl"],
        "federation.mode: sfl runs in synchronous rounds only, not async: split learning",
    ),
    (["--set", "federation.mode=later"], "federation.mode: Input should be 'sync', 'deadline' or 'async'"),
]


@pytest.fixture(scope="module")
def bad_input_dir(tmp_path_factory):
    """A folder with the files the bad inputs name: broken configs, runs without (good) checkpoints."""
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "bad.yaml").write_text("federation:\n  lr: [1, 2\n")
    (root / "dup.yaml").write_text("federation:\n  lr: 0.1\nfederation:\n  rounds: 3\n")
    (root / "cfg.yaml").write_text("federation:\n  rounds: 1\n")
    (root / "folder").mkdir()
    (root / "a-file").write_text("not a folder\n")
    run_local(
        load_config(None, ["federation.rounds=2", "model.name=mlp", "federation.checkpoint_every=1"]), root / "done"
    )
    shutil.copytree(root / "done", root / "corrupt")
    for path in (root / "corrupt" / "checkpoints").iterdir():
        path.write_bytes(path.read_bytes()[:100])
    shutil.copytree(root / "done", root / "fresh")
    shutil.rmtree(root / "fresh" / "checkpoints")
    # Checkpoints and tables that do not belong to the run resumed (tests/test_cli.py::BAD_INPUTS).
    adam = root / "adam-run"
    run_local(load_config(None, ["federation.rounds=2", "model.name=mlp", "algorithm.name=fedadam"]), adam)
    shutil.copytree(root / "done", root / "adam-checkpoints")
    shutil.rmtree(root / "adam-checkpoints" / "checkpoints")
    shutil.move(adam / "checkpoints", root / "adam-checkpoints" / "checkpoints")
    shutil.rmtree(adam)
    shutil.copytree(root / "done", root / "heterofl-config")
    dump_config(load_config(None, ["algorithm.name=heterofl"]), root / "heterofl-config" / "config.yaml")
    shutil.copytree(root / "done", root / "short-table")
    metrics = root / "short-table" / "metrics.parquet"
    pd.read_parquet(metrics).iloc[:1].to_parquet(metrics)
    newest = checkpoint.latest(root / "done")
    crafted = {
        "far-round": (newest.state.replace(round=10**12), newest.config),
        "misnamed": (newest.state, newest.config),
        "nan": (
            newest.state.replace(weights={**newest.state.weights, "1.bias": np.full(200, np.nan, "f4")}),
            newest.config,
        ),
        "reshaped": (
            newest.state.replace(weights={**newest.state.weights, "1.bias": np.zeros(3, "f4")}),
            newest.config,
        ),
        "unsigned": (newest.state, None),
    }
    for name, (state, config) in crafted.items():
        shutil.copytree(root / "done", root / name)
        shutil.rmtree(root / name / "checkpoints")
        written = checkpoint.save(root / name, state, newest.virtual_time_s, config=config)
        if name == "misnamed":
            written.rename(written.with_name("round_00009.pt"))
    return root


def snapshot(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("mode", [["--local"], []], ids=["local", "ray"])
@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[m.split(":")[0][:40] for _, m in BAD_INPUTS])
def test_every_bad_input_exits_2_with_one_line_and_writes_nothing(
    bad_input_dir, monkeypatch, capsys, mode, args, message
):
    from rayfl.cli import main

    monkeypatch.chdir(bad_input_dir)
    before = snapshot(bad_input_dir)
    assert main(["run", *mode, "--set", "ray.dashboard=false", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rayfl: error: {message}"), lines
    assert snapshot(bad_input_dir) == before and not (bad_input_dir / "runs").exists()


def test_resume_passes_over_a_truncated_newest_checkpoint(bad_input_dir, tmp_path, capsys):
    from rayfl.cli import main

    run = tmp_path / "run"
    shutil.copytree(bad_input_dir / "done", run)
    newest = run / "checkpoints" / "round_00002.pt"
    newest.write_bytes(newest.read_bytes()[:200])
    assert main(["run", "--local", "--resume", str(run), "--set", "federation.rounds=3"]) == 0
    notices = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rayfl:")]
    assert len(notices) == 1 and notices[0].startswith(f"rayfl: {newest} (")
    assert notices[0].endswith(f"unreadable: resuming from {run / 'checkpoints' / 'round_00001.pt'}")
    metrics = pd.read_parquet(run / "metrics.parquet")
    reference = pd.read_parquet(bad_input_dir / "done" / "metrics.parquet")
    assert metrics["round"].tolist() == [1, 2, 3]
    pd.testing.assert_frame_equal(metrics.iloc[:2].drop(columns="wall_time_s"), reference.drop(columns="wall_time_s"))


def test_the_progress_bar_of_a_resumed_run_counts_from_its_rounds():
    from rayfl.console import ProgressBar

    bar = ProgressBar(total=5)
    bar({"round": 4, "test_accuracy": 0.5, "virtual_time_s": 10.0})
    assert bar.bar.n == 4 and bar.bar.postfix.startswith("acc=0.500")
    bar({"round": 5, "test_accuracy": float("nan"), "virtual_time_s": 12.0})
    assert bar.bar.n == 5 and bar.bar.postfix.startswith("acc=-")
    bar.close()


def test_submission_retries_transient_errors_for_a_bounded_time():
    from rayfl.api import retried

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError(
                "Request failed with status code 500: No available agent to submit job, please try again later."
            )
        return "raysubmit_1"

    assert retried(flaky, "submitting") == "raysubmit_1" and len(calls) == 3
    calls.clear()
    with pytest.raises(RuntimeError, match="status code 400"):
        retried(
            lambda: calls.append(1) or (_ for _ in ()).throw(RuntimeError("Request failed with status code 400: bad")),
            "submitting",
        )
    assert len(calls) == 1  # not transient: no retry
    with pytest.raises(RuntimeError, match="No available agent"):
        retried(lambda: (_ for _ in ()).throw(RuntimeError("No available agent")), "submitting", budget_s=1.0)


def test_a_misspelt_key_is_reported_before_torch_or_ray_load():
    # whole process: the error in under 1.5 s of CPU (the wall time a busy machine adds is not the
    # CLI's), and neither torch nor Ray imported by then
    import resource

    code = (
        "import sys; from rayfl.cli import main; rc = main(['run', '--set', 'federation.rouns=3']); "
        "print(rc, 'torch' in sys.modules, 'ray' in sys.modules)"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr
    assert done.stderr.strip() == "rayfl: error: federation.rouns: unknown key (did you mean 'rounds'?)"
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 1.5


def interrupted(run_dir, sets: list[str], once) -> str:
    """Ctrl-C to `rayfl run --local --out run_dir` (1000 rounds of the mlp, `--set`s `sets`) as soon
    as the path `once` exists (an event, not a time): its exit status must be 130; its last line."""
    import signal
    import time

    args = ["run", "--local", "--out", str(run_dir)]
    args += [a for s in ["model.name=mlp", "federation.rounds=1000", *sets] for a in ("--set", s)]
    run = subprocess.Popen([sys.executable, "-m", "rayfl", *args], stderr=subprocess.PIPE, text=True)
    while not once.exists() and run.poll() is None:
        time.sleep(0.05)
    run.send_signal(signal.SIGINT)
    err = run.communicate(timeout=120)[1]
    assert run.returncode == 130, err
    return err.splitlines()[-1]


def test_ctrl_c_says_how_to_resume_and_the_resume_finishes_the_run(tmp_path):
    run_dir = tmp_path / "run"
    last = interrupted(run_dir, ["federation.checkpoint_every=1"], run_dir / "checkpoints" / "round_00001.pt")
    assert last == f"rayfl: interrupted; continue it with: rayfl run --resume {run_dir}"
    newest = max(int(p.stem.removeprefix("round_")) for p in (run_dir / "checkpoints").glob("round_*.pt"))
    done = rayfl("run", "--local", "--resume", str(run_dir), "--set", f"federation.rounds={newest + 2}")
    assert done.returncode == 0, done.stderr
    assert pd.read_parquet(run_dir / "metrics.parquet")["round"].tolist() == list(range(1, newest + 3))


def test_ctrl_c_before_the_first_checkpoint_says_the_command_that_starts_it_again(tmp_path):
    # the folder holds a run from its first moment (config.yaml): the same command is refused, and
    # there is nothing to resume, so the line names the one that works, and that one does
    run_dir = tmp_path / "run"
    last = interrupted(run_dir, ["federation.checkpoint_every=0"], run_dir / "config.yaml")
    assert last == f"rayfl: interrupted; no checkpoint was written yet; start it again with --out {run_dir} --overwrite"
    again = ["run", "--local", "--set", "model.name=mlp", "--set", "federation.rounds=2", "--out", str(run_dir)]
    assert rayfl(*again).returncode == 2
    done = rayfl(*again, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert pd.read_parquet(run_dir / "metrics.parquet")["round"].tolist() == [1, 2]


def test_job_commands_take_the_dashboard_from_the_flag_then_rays_variable_then_the_kept_head(monkeypatch):
    # never a hard-coded port: `rayfl up` takes another when 8265 is taken, and says so
    from actors.driver import head

    kept = {"address": "127.0.0.1:6000", "dashboard": "http://127.0.0.1:8301"}
    monkeypatch.setattr(head, "kept", lambda: kept)
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    assert head.dashboard("http://h:1") == "http://h:1" and head.dashboard(None) == "http://127.0.0.1:8301"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://ray:2")
    assert head.dashboard(None) == "http://ray:2"
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS")
    kept["dashboard"] = None
    with pytest.raises(ConfigError, match=r"^--address: no dashboard .*rayfl up --dashboard; the head rayfl up keeps"):
        head.dashboard(None)
    monkeypatch.setattr(head, "kept", lambda: None)
    with pytest.raises(ConfigError, match=r"start a head with rayfl up --dashboard$"):
        head.dashboard(None)


def test_a_jobs_upload_leaves_out_what_git_ignores_and_each_file_over_the_limit_else_says_which(tmp_path, capsys):
    # never a bare 413: the dashboard takes at most UPLOAD_LIMIT in one request (here 100 bytes)
    from rayfl.upload import EXCLUDES, upload_excludes

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("runs/\n")  # 6 bytes
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "ignored.bin").write_bytes(b"x" * 500)  # git ignores it: never measured
    (tmp_path / "my_images").mkdir()
    (tmp_path / "my_images" / "huge.bin").write_bytes(b"x" * 150)  # alone over the limit: left out
    (tmp_path / "a.txt").write_bytes(b"x" * 60)
    assert upload_excludes(tmp_path, limit=100) == [*EXCLUDES, "/my_images/huge.bin"]
    assert capsys.readouterr().err == (
        "rayfl: left out of the job's upload, each over the dashboard's 100 bytes: my_images/huge.bin (150 bytes)\n"
    )
    (tmp_path / "b.txt").write_bytes(b"x" * 40)  # 6 + 60 + 40 = 106 > 100
    with pytest.raises(
        ConfigError,
        match=r": the job's upload .* is 106 bytes, over the dashboard's 100 bytes; the largest: a\.txt \(60 bytes\)",
    ):
        upload_excludes(tmp_path, limit=100)


def test_run_help_shows_two_examples_that_load_and_points_to_the_key_reference(capsys):
    import shlex

    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    said = capsys.readouterr().out
    examples = [line.strip() for line in said.split("examples:\n", 1)[1].splitlines() if line.startswith("  rayfl run")]
    assert done.value.code == 0 and len(examples) == 2 and "docs/config.md" in said
    assert (ROOT / "docs" / "config.md").is_file()
    for example in examples:  # each one's config loads as written (paths from the repository's root)
        words = shlex.split(example)[2:]
        sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        files = [w for i, w in enumerate(words) if w.endswith(".yaml") and words[i - 1] != "--set"]
        load_config(ROOT / files[0] if files else None, sets)


def test_a_run_on_the_kept_head_is_asked_to_stop_before_down_stops_the_head(monkeypatch, tmp_path):
    # down's signal sets the flag the driver's loop over the rounds reads (`follow.follow`); the
    # run's file says down whom to ask and goes with the run (tests.actors.down_drill: 20 real tries)
    import os
    import signal

    from actors.driver import head

    monkeypatch.setattr(head, "DRIVERS", tmp_path / "drivers")
    monkeypatch.setattr(head, "kept", lambda: {"address": "127.0.0.1:6000"})
    before = signal.getsignal(signal.SIGUSR1)
    with head.on_the_kept_head("127.0.0.1:7000"):  # another cluster: nothing held
        assert not (tmp_path / "drivers").exists()
    with head.on_the_kept_head("127.0.0.1:6000"):
        held = tmp_path / "drivers" / str(os.getpid())
        assert held.is_file() and not head.STOPPING.is_set()
        (tmp_path / "drivers" / "999999999").touch()  # a run that ended without removing its file
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        (tmp_path / "drivers" / str(other.pid)).write_text("0.0")  # its pid, another process's now
        head.stop_runs(timeout_s=0.5)  # asks this process's run (which keeps running here: 0.5 s)
        assert head.STOPPING.is_set() and held.is_file() and not (tmp_path / "drivers" / "999999999").exists()
        assert not (tmp_path / "drivers" / str(other.pid)).exists()
        with pytest.raises(subprocess.TimeoutExpired):  # never signalled: alive a second later
            other.wait(timeout=1)
        other.kill()
    assert not held.exists() and signal.getsignal(signal.SIGUSR1) == before and not head.STOPPING.is_set()

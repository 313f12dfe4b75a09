"""Every crafted input of issue 30's drill is refused before anything starts: exit 2, one line
naming the key or file, nothing written (the run is started from an empty folder, which must
stay as it was), in process and on Ray alike (found before a cluster would start)."""

import pytest
import torch

from rayfl.cli import main
from rayfl.config import MAX_SHOWN

pytestmark = pytest.mark.faults


@pytest.fixture(params=[["--local"], ["--set", "ray.dashboard=false"]], ids=["local", "ray"])
def mode(request):
    return request.param


def refused(tmp_path, monkeypatch, capsys, argv, mode=("--local",)):
    """The one stderr line of a refused `rayfl run` started in an empty folder (left empty)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    assert main(["run", *mode, *argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("rayfl: error: "), err
    assert list(work.iterdir()) == []  # nothing written
    return err[0].removeprefix("rayfl: error: ")


def config_file(tmp_path, content: bytes):
    path = tmp_path / "cfg.yaml"
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("federation.lr", ".inf", "--set federation.lr: the value: inf is not a finite number"),
        ("ray.cpus_per_actor", ".nan", "--set ray.cpus_per_actor: the value: nan is not a finite number"),
        ("devices.compute_scale", "-.inf", "--set devices.compute_scale: the value: -inf is not a finite number"),
        ("federation.rounds", str(10**30), "federation.rounds: Input should be less than or equal to 1000000"),
        ("federation.rounds", str(10**9), "federation.rounds: Input should be less than or equal to 1000000"),
        (
            "federation.clients_per_round",
            str(10**7),
            "federation.clients_per_round: Input should be less than or equal to 100000",
        ),
        ("data.num_clients", str(10**12), "data.num_clients: Input should be less than or equal to 1000000000"),
        (
            "ray.num_actors",
            str(10**5),
            "ray.num_actors: Input should be 'auto' or Input should be less than or equal to 10000",
        ),
    ],
)
def test_numbers_that_are_not_finite_or_would_exhaust_memory(tmp_path, monkeypatch, capsys, mode, key, value, said):
    assert refused(tmp_path, monkeypatch, capsys, ["--set", f"{key}={value}"], mode) == said


@pytest.mark.parametrize(
    "sets, said",
    [
        (["federation.precision=fp8"], "federation.precision: Input should be 'fp32' or 'bf16'"),
        # 1000 clients of a 67M-parameter MLP at once: about a terabyte of training memory
        (
            [
                "model.name=mlp",
                "model.hidden=[8192, 8192]",
                "data.num_clients=1000",
                "data.partition={kind: sampled, size: 10}",
                "federation.clients_per_round=1000",
                "ray.clients_per_call=1000",
                "ray.vectorize=1000",
            ],
            "ray.vectorize: 1000 clients of model mlp need ",
        ),
        (["algorithm.name=localonly", "ray.sums=device"], "ray.sums: device: localonly's aggregate is not a sum"),
        (["algorithm.name=sfl", "ray.sums=device"], "ray.sums: device: sfl's aggregate is not a sum"),
        (["federation.mode=async", "ray.sums=device"], "ray.sums: device: under federation.mode async"),
    ],
    ids=["precision", "vectorize-width", "sums-localonly", "sums-split", "sums-async"],
)
def test_what_the_client_loop_cannot_honour(tmp_path, monkeypatch, capsys, mode, sets, said):
    assert refused(tmp_path, monkeypatch, capsys, [a for s in sets for a in ("--set", s)], mode).startswith(said)


def test_a_non_finite_number_in_a_file_or_a_config_built_in_python_is_named_by_its_key(
    tmp_path, monkeypatch, capsys, mode
):
    from rayfl.config import ConfigError
    from rayfl.load import parse_config

    path = config_file(tmp_path, b"federation:\n  lr: .inf\n")
    assert refused(tmp_path, monkeypatch, capsys, [path], mode) == f"{path}: federation.lr: inf is not a finite number"
    with pytest.raises(ConfigError, match=r"^ray.cpus_per_actor: Input should be a finite number$"):
        parse_config({"ray": {"cpus_per_actor": float("inf")}})


@pytest.mark.parametrize(
    "content, said",
    [
        (b"federation:\n  rounds: \xff\xfe\n", "not UTF-8 text (byte 22)"),
        (b"? [a, b]\n: 1\n", "line 1 a key must be a plain value, not a list or mapping"),
        (b"[" * 100_000 + b"]" * 100_000, "line 1 nested more than 64 levels deep"),
        (b"a:\n" + b"".join(b"  " * k + b"b:\n" for k in range(1, 80)), "line 65 nested more than 64 levels deep"),
        (b"x: " + b"y" * (1024 * 1024), "larger than 1 MB"),
        (b"x: [" + b"1, " * 60_000 + b"]\n", "line 1 more than 50000 values"),
        (
            b"a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n",
            "line 2 an alias (*name) is not allowed",
        ),
        (b"seed: 2024-13-01\n", "invalid value (month must be in 1..12)"),
        (
            b"seed: " + b"9" * 5000 + b"\n",
            "invalid value (Exceeds the limit (4300 digits) for integer string conversion: value has 5000 di)",
        ),
    ],
    ids=[
        "not-utf8",
        "complex-key",
        "deep-list",
        "deep-mapping",
        "oversized",
        "too-many-values",
        "alias-bomb",
        "bad-date",
        "huge-integer",
    ],
)
def test_files_that_are_not_plain_small_utf8_yaml(tmp_path, monkeypatch, capsys, mode, content, said):
    path = config_file(tmp_path, content)
    assert refused(tmp_path, monkeypatch, capsys, [path], mode) == f"{path}: {said}"


def test_echoed_text_is_cut_and_its_control_and_bidi_characters_escaped(tmp_path, monkeypatch, capsys, mode):
    said = refused(tmp_path, monkeypatch, capsys, ["--set", "federation.\u202erounds\x1b[2J=3"], mode)
    assert "\u202e" not in said and "\x1b" not in said and "federation.\\u202erounds\\u001b[2J: unknown key" in said
    said = refused(tmp_path, monkeypatch, capsys, ["--set", "algorithm.name=" + "x" * 50_000], mode)
    assert len(said) <= MAX_SHOWN and "characters)..." in said and said.startswith("algorithm.name: unknown algorithm")


def test_a_list_too_short_is_named_as_such(tmp_path, monkeypatch, capsys, mode):
    profile = config_file(
        tmp_path,
        b"name: p\nclasses:\n  - {name: a, proportion: 1, flops: [1.0e+9], memory_mb: 100, bandwidth_mbps: [1]}\n",
    )
    said = refused(tmp_path, monkeypatch, capsys, ["--set", f"devices.profile={profile}"], mode)
    assert said == f"{profile}: classes.0.bandwidth_mbps: 1 item given; it takes 2"


def test_a_key_with_look_alike_letters_is_shown_escaped(tmp_path, monkeypatch, capsys, mode):
    said = refused(tmp_path, monkeypatch, capsys, ["--set", "f\u0435deration.rounds=1"], mode)  # a Cyrillic e
    assert said == "f\\u0435deration: unknown key (did you mean 'federation'?)"


@pytest.mark.parametrize("where", ["--out", "data.data_dir", "model.init_weights"])
def test_paths_that_cannot_be_looked_up_are_refused_naming_the_key(tmp_path, monkeypatch, capsys, mode, where):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    long = tmp_path / ("a" * 300)
    for path, why in ((loop / "run", "a symlink loop"), (long, "a name of 300 bytes; at most 255")):
        argv = ["--out", str(path)] if where == "--out" else ["--set", f"{where}={path}"]
        said = refused(tmp_path, monkeypatch, capsys, argv, mode)
        assert said.startswith(f"{where}: ") and said.endswith(why), said


def test_a_pickled_weights_file_is_refused_naming_the_key_and_runs_no_code(tmp_path, monkeypatch, capsys, mode):
    import pickle

    weights = tmp_path / "weights.pt"
    weights.write_bytes(pickle.dumps({"w": [1.0]}))  # any pickle is refused, before its code could run
    said = refused(tmp_path, monkeypatch, capsys, ["--set", f"model.init_weights={weights}"], mode)
    assert said == (
        f"model.init_weights: {weights} is not a file of named tensors (torch.save of a model's state_dict); rayfl "
        "never runs code from a weights file"
    )


@pytest.mark.parametrize(
    "saved, why",
    [
        ({"state": {"round": 1}, "virtual_time_s": 0.0}, "its state is a dict, not a ServerState"),
        ({"weights": {}}, "not a rayfl checkpoint"),
        (
            {"state": {"__dataclass__": "rayfl.config:RunConfig", "fields": {}}, "virtual_time_s": 0.0},
            "'rayfl.config:RunConfig' is not one of rayfl's state types",
        ),
        (
            {
                "state": {
                    "__dataclass__": "rayfl.algorithms.messages:ServerState",
                    "fields": {"round": -1, "weights": {}},
                },
                "virtual_time_s": 0.0,
            },
            "round is not a count",
        ),
        (
            {
                "state": {
                    "__dataclass__": "rayfl.algorithms.messages:ServerState",
                    "fields": {"round": 1, "weights": {"w": torch.zeros(1)}},
                },
                "virtual_time_s": float("inf"),
            },
            "virtual_time_s is not a finite number",
        ),
    ],
    ids=["dict-state", "no-state", "foreign-dataclass", "negative-round", "infinite-clock"],
)
def test_a_checkpoint_that_is_not_a_server_state_is_refused(tmp_path, monkeypatch, capsys, saved, why):
    from rayfl import checkpoint
    from rayfl.config import ConfigError

    run_dir = tmp_path / "run"
    assert (
        main(["run", "--local", "--out", str(run_dir), "--set", "federation.rounds=1", "--set", "model.name=mlp"]) == 0
    )
    path = run_dir / "checkpoints" / "round_00001.pt"
    torch.save(saved, path)  # loads under weights_only: plain dicts, numbers and tensors
    torch.load(path, weights_only=True)
    with pytest.raises(ConfigError, match="no readable checkpoint"):
        checkpoint.latest(run_dir)
    before = sorted(p.name for p in run_dir.rglob("*"))
    capsys.readouterr()
    assert main(["run", "--local", "--resume", str(run_dir), "--set", "federation.rounds=2"]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith(f"rayfl: error: --resume {run_dir}: no readable checkpoint: {path} (") and why in err
    assert sorted(p.name for p in run_dir.rglob("*")) == before


def rayfl_in(folder, *argv, **env):
    """`rayfl run` in a fresh process (this one may already hold a Ray session), from `folder`."""
    import os
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | env
    return subprocess.run(
        [sys.executable, "-m", "rayfl", "run", *argv],
        cwd=folder,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "address, said",
    [
        ("127.0.0.1:{port}", "--address 127.0.0.1:{port}: nothing answers there (Connection refused)"),
        ("http://127.0.0.1:{port}", "--address http://127.0.0.1:{port}: a dashboard's address (rayfl submit takes it)"),
        ("127.0.0.1", "--address 127.0.0.1: not HOST:PORT"),
    ],
    ids=["nothing-listens", "dashboard-url", "no-port"],
)
def test_an_address_where_no_head_answers_fails_at_once_with_one_line(tmp_path, address, said):
    port = free_port()
    done = rayfl_in(tmp_path, "--address", address.format(port=port), "--set", "federation.rounds=1")
    assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith(
        f"rayfl: error: {said.format(port=port)}"
    ), done.stderr
    assert len(done.stderr.splitlines()) == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "command",
    [
        ["submit", "--address", "http://127.0.0.1:{port}"],
        ["fetch", "some-job", "--address", "http://127.0.0.1:{port}"],
        ["pool", "status", "--address", "http://127.0.0.1:{port}"],
        ["pool", "status", "--address", "127.0.0.1:{port}"],
        ["tune", "{tune}", "--address", "127.0.0.1:{port}"],
    ],
    ids=["submit", "fetch", "pool-dashboard", "pool-gcs", "tune"],
)
def test_every_path_to_a_cluster_where_nothing_listens_is_one_line_and_exit_2(tmp_path, command):
    """Not a minute of the job client's retries (issue: 11 lines, exit 1 after 61-72 s); nothing
    written. A fresh process each: this one may hold a Ray session, which a command would join."""
    import os
    import subprocess
    import sys

    from rayfl.api import REPO_ROOT

    port = free_port()
    tune = tmp_path / "tune.yaml"
    tune.write_text(
        f"base: {REPO_ROOT / 'examples' / 'fedprox_synthetic.yaml'}\nsearch:\n  algorithm.mu: {{grid: [0.0, 0.1]}}\n"
        f"storage: {tmp_path / 'experiments'}\n"
    )
    argv = [part.format(port=port, tune=tune) for part in command]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "rayfl", *argv], env=env, capture_output=True, text=True, timeout=120)
    address = command[-1].format(port=port)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"rayfl: error: --address {address}: ")
    assert "nothing answers there" in lines[0] or "no Ray dashboard answers there" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tune.yaml"]


def test_a_dashboard_address_that_answers_as_something_else_is_named(monkeypatch, capsys):
    import http.server
    import threading

    class NotADashboard(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotADashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert main(["fetch", "some-job", "--address", url]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"rayfl: error: --address {url}: answers HTTP 404, not as a Ray dashboard"
        ]
    finally:
        server.shutdown()


def test_gpus_this_machine_lacks_are_refused_before_a_local_cluster_starts(tmp_path):
    done = rayfl_in(
        tmp_path, "--set", "ray.gpus_per_actor=0.5", CUDA_VISIBLE_DEVICES="", RAY_TMPDIR=str(tmp_path / "ray")
    )
    assert (
        done.returncode == 2
        and done.stderr.strip()
        == "rayfl: error: ray.num_actors: 1 client actors x 0.5 GPU need 0.5 GPU; the cluster has 0"
    ), done.stderr
    assert list(tmp_path.iterdir()) == []  # no RUN_DIR, and no Ray session folder: no cluster started


BOUNDED = {
    **dict.fromkeys(["heterofl", "alllarge", "allsmall", "exclusivefl"], 10_000),  # HeteroFL and its baselines
    **dict.fromkeys(["fedepth", "mfedepth", "depthfl", "splitmix"], 10_000),  # FeDepth's family
    **dict.fromkeys(["inclusivefl", "alllarge_depth", "allsmall_depth", "exclusivefl_depth"], 10_000),
    "sfl": 10_000,
    **dict.fromkeys(["mergesfl", "adasfl"], 1_000),  # a selection over every worker each round
}


def test_algorithms_that_work_over_every_client_refuse_a_population_past_their_bound():
    """Issue: HeteroFL at 10^9 lazily drawn clients looped over every client for minutes, neither
    refused nor bounded. Those algorithms name their bound; the lazily drawn ones take 10^9."""
    from rayfl.algorithms import registry
    from rayfl.config import ConfigError
    from rayfl.load import load_config

    assert {n: a.max_clients for n, a in registry.algorithms().items() if a.over_every_client} == BOUNDED
    for name, bound in BOUNDED.items():
        assert load_config(None, [f"algorithm.name={name}", f"data.num_clients={bound}"]).data.num_clients == bound
        with pytest.raises(ConfigError, match=rf"^data.num_clients: {name} works over every client \(.+\): at most "):
            load_config(None, [f"algorithm.name={name}", f"data.num_clients={bound + 1}"])
    assert load_config(None, ["data.num_clients=1000000000"]).data.num_clients == 10**9  # fedavg: lazily drawn

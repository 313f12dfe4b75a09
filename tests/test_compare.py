"""`rayfl compare`: seeds pooled per config, figures by hand, the plots' common grids, bad input."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rayfl.cli import main
from rayfl.compare import Run, curves, labels, read_runs, table
from rayfl.load import parse_config
from rayfl.storage import dump_config

NAN = math.nan


def fake_run(path, raw, accuracy, virtual, bytes_up=100):
    """A run directory with a config and a hand-written metrics table (3 rounds)."""
    path.mkdir(parents=True)
    dump_config(parse_config(raw), path / "config.yaml")
    pd.DataFrame(
        {
            "round": [1, 2, 3],
            "virtual_time_s": virtual,
            "wall_time_s": [1.0, 2.0, 3.0],
            "test_accuracy": accuracy,
            "test_loss": [1.0, 1.0, 1.0],
            "bytes_up": [bytes_up] * 3,
            "bytes_down": [200] * 3,
            "num_clients": [2, 2, 2],
            "mean_wait_s": [1.0, 2.0, 3.0],
            "kl": [0.1, 0.2, 0.6],
        }
    ).to_parquet(path / "metrics.parquet")
    return path


@pytest.fixture
def runs(tmp_path):
    return [
        fake_run(tmp_path / "a0", {"seed": 0}, [0.5, NAN, 0.8], [10.0, 20.0, 30.0]),
        # another seed of the same config; the actor count does not change what a run computes
        fake_run(
            tmp_path / "a1", {"seed": 1, "ray": {"num_actors": 2}}, [0.6, 0.76, 0.9], [12.0, 24.0, 36.0], bytes_up=400
        ),
        fake_run(
            tmp_path / "b0",
            {"algorithm": {"name": "fedprox", "mu": 0.1}, "data": {"partition": {"kind": "iid"}}},
            [0.4, 0.5, 0.6],
            [10.0, 20.0, 30.0],
        ),
    ]


def test_seeds_of_a_config_are_pooled_and_figures_match_the_hand_numbers(runs):
    groups = read_runs(runs)
    assert [[r.path.name for r in g] for g in groups] == [["a0", "a1"], ["b0"]]
    t = table(groups, target=0.75).set_index("algorithm")
    assert (
        t.loc["fedavg", "config"] == "data.partition.kind=dirichlet"
        and t.loc["fedprox", "config"] == "data.partition.kind=iid"
    )
    a = t.loc["fedavg"]
    assert a["seeds"] == 2 and a["reached"] == 2
    assert a["final_accuracy_mean"] == pytest.approx(0.85) and a["final_accuracy_std"] == pytest.approx(
        0.1 / math.sqrt(2)
    )
    assert a["best_accuracy_mean"] == pytest.approx(0.85)
    # seed 0 reaches 0.75 at round 3 (30 s), seed 1 at round 2 (24 s)
    assert a["time_to_target_s_mean"] == pytest.approx(27.0) and a["time_to_target_s_std"] == pytest.approx(
        math.sqrt(18)
    )
    assert a["rounds_to_target_mean"] == pytest.approx(2.5)
    assert a["bytes_mb_mean"] == pytest.approx((900 + 1800) / 2 / 1e6) and a["mean_wait_s_mean"] == pytest.approx(2.0)
    assert a["virtual_time_s_mean"] == pytest.approx(33.0) and a["wall_time_s_mean"] == pytest.approx(3.0)
    b = t.loc["fedprox"]
    assert b["reached"] == 0 and math.isnan(b["time_to_target_s_mean"]) and math.isnan(b["final_accuracy_std"])
    # final accuracy over the last 2 evaluated rounds, and an extra column's mean over rounds
    t2 = table(groups, target=0.75, last=2, columns=["kl"]).set_index("algorithm")
    assert t2.loc["fedavg", "final_accuracy_mean"] == pytest.approx((0.65 + 0.83) / 2) and t2.loc[
        "fedprox", "kl_mean"
    ] == pytest.approx(0.3)


def test_a_config_is_named_by_its_ablations_and_the_other_keys_that_differ():
    def run(**config):
        return [Run(Path("."), config, None, pd.DataFrame())]

    groups = [
        run(**{"algorithm.name": "mergesfl", "algorithm.merge": True, "algorithm.alpha": 0.8, "data.p": 10}),
        run(**{"algorithm.name": "mergesfl", "algorithm.merge": False, "algorithm.alpha": 0.8, "data.p": 10}),
        run(**{"algorithm.name": "adasfl", "algorithm.merge": False, "algorithm.alpha": 0.5, "data.p": 10}),
        run(**{"algorithm.name": "fedavg", "data.p": 1}),
    ]
    # alpha differs only across algorithms, merge within MergeSFL; p is not an algorithm option
    assert labels(groups) == [
        "algorithm.merge=True, data.p=10",
        "algorithm.merge=False, data.p=10",
        "data.p=10",
        "data.p=1",
    ]


def test_curves_put_the_seeds_on_one_grid(runs):
    group = read_runs(runs)[0]
    x, ys = curves(group, "round")
    assert x.tolist() == [1, 3] and ys.tolist() == [[0.5, 0.8], [0.6, 0.9]]  # rounds both seeds evaluated
    x, ys = curves(group, "virtual_time_s")  # from 12 s (seed 1's first) to 30 s (seed 0's last)
    assert x[0] == 12.0 and x[-1] == 30.0 and len(x) == 200
    assert ys[:, 0] == pytest.approx([0.5 + 0.3 * 2 / 20, 0.6]) and ys[:, -1] == pytest.approx(
        [0.8, 0.76 + 0.14 * 6 / 12]
    )
    x, _ = curves(
        group, "bytes_mb"
    )  # cumulative traffic at the evaluated rounds: seed 0 300, 900 B; seed 1 600, 1200, 1800 B
    assert x[0] == pytest.approx(600e-6) and x[-1] == pytest.approx(900e-6)


def test_the_command_prints_the_table_and_writes_csv_markdown_and_plots(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, runs), "--target", "0.75", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "0.8500 ± 0.0707" in printed and "27 ± 4" in printed and "2/2" in printed and "0/1" in printed
    assert sorted(p.name for p in out.iterdir()) == [
        "accuracy_vs_bytes.png",
        "accuracy_vs_round.png",
        "accuracy_vs_virtual_time.png",
        "compare.csv",
        "compare.md",
    ]
    assert pd.read_csv(out / "compare.csv")["seeds"].tolist() == [2, 1]
    assert (out / "compare.md").read_text().strip() == printed.split(f"\n{out}:")[0].strip()
    assert np.all(pd.read_csv(out / "compare.csv")["final_accuracy_mean"].to_numpy() == pytest.approx([0.85, 0.6]))


def test_a_run_never_evaluated_and_runs_without_a_target_still_compare(tmp_path, capsys):
    runs = [
        fake_run(tmp_path / "a", {}, [NAN, NAN, NAN], [1.0, 2.0, 3.0]),
        fake_run(tmp_path / "b", {"seed": 1}, [0.2, 0.3, 0.4], [1.0, 2.0, 3.0]),
    ]
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "cmp")]) == 0
    row = capsys.readouterr().out.splitlines()[2]  # one config, two seeds: the evaluated one gives the figures
    assert "| 0.4000" in row and row.rstrip("| ").endswith("-")  # no target anywhere: reached target "-"
    assert len(list((tmp_path / "cmp").glob("*.png"))) == 3


@pytest.mark.parametrize(
    "args, message",
    [
        (["nowhere"], "nowhere: no metrics.parquet"),
        (["RUN", "--target", "1.5"], "--target: 1.5"),
        (["RUN", "--last", "0"], "--last: 0"),
        (["RUN", "--column", "kll"], "--column: no run's metrics.parquet has a column 'kll'"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(runs, tmp_path, capsys, args, message):
    out = tmp_path / "cmp"
    args = [str(runs[0]) if a == "RUN" else str(tmp_path / a) if a == "nowhere" else a for a in args]
    assert main(["compare", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not out.exists()


def test_settings_of_a_mode_a_run_does_not_use_leave_it_a_seed_of_its_config(tmp_path):
    # a sync run with FedAsync's mixing set computes what the default sync run does; a FedBuff
    # run with another buffer does not
    a = fake_run(tmp_path / "a", {"seed": 0}, [0.5, 0.6, 0.7], [1.0, 2.0, 3.0])
    b = fake_run(
        tmp_path / "b", {"seed": 1, "federation": {"async": {"mixing": 0.9}}}, [0.5, 0.6, 0.7], [1.0, 2.0, 3.0]
    )
    c = fake_run(
        tmp_path / "c", {"federation": {"mode": "async", "async": {"buffer_size": 3}}}, [0.5, 0.6, 0.7], [1.0, 2.0, 3.0]
    )
    d = fake_run(
        tmp_path / "d", {"federation": {"mode": "async", "async": {"buffer_size": 4}}}, [0.5, 0.6, 0.7], [1.0, 2.0, 3.0]
    )
    groups = read_runs([a, b, c, d])
    assert [[r.path.name for r in g] for g in groups] == [["a", "b"], ["c"], ["d"]]
    assert labels(groups) == [
        "federation.mode=sync",
        "federation.async.buffer_size=3, federation.mode=async",
        "federation.async.buffer_size=4, federation.mode=async",
    ]

"""A user's day: config paths relative to their file, Tune's scheduler fitted to the rounds, the
catalog without torch, did-you-mean, default profiles and the collapse warning, URI RUN_DIRs."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rayfl import catalog
from rayfl.algorithms import registry
from rayfl.cli import main
from rayfl.config import ConfigError
from rayfl.load import load_config

ROOT = Path(__file__).resolve().parent.parent
PHONES = ROOT / "tests" / "devices" / "phones.yaml"
SMALL = ["federation.rounds=1", "federation.clients_per_round=2", "data.num_clients=4", "model.name=mlp"]


def test_paths_in_a_config_are_read_against_its_folder_and_stored_absolute(tmp_path, monkeypatch):
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "phones.yaml").write_text(PHONES.read_text())
    (folder / "run.yaml").write_text("devices: {profile: phones.yaml}\nmodel: {name: mlp, init_weights: w.pt}\n")
    (folder / "w.pt").write_bytes(b"")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(folder / "run.yaml")
    assert cfg.devices.profile == str(folder / "phones.yaml") and cfg.model.init_weights == folder / "w.pt"
    # A built-in profile name stays a name; a --set path is read against the working directory.
    assert load_config(None, ["devices.profile=jetson"]).devices.profile == "jetson"
    (elsewhere / "mine.yaml").write_text(PHONES.read_text())
    assert load_config(None, ["devices.profile=mine.yaml"]).devices.profile == str(elsewhere / "mine.yaml")


def test_a_run_dir_config_resumes_from_any_folder(tmp_path, monkeypatch):
    (tmp_path / "phones.yaml").write_text(PHONES.read_text())
    (tmp_path / "run.yaml").write_text("devices: {profile: phones.yaml}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "run.yaml", "--local", "--out", "r", *[a for s in SMALL for a in ("--set", s)]]) == 0
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    assert main(["run", "--local", "--resume", str(tmp_path / "r"), "--set", "federation.rounds=2"]) == 0
    assert len(pd.read_parquet(tmp_path / "r" / "metrics.parquet")) == 2


def test_tune_base_is_relative_to_the_tune_file_and_asha_fits_the_rounds(tmp_path, monkeypatch):
    from tune.run import scheduler
    from tune.spec import load_experiment

    monkeypatch.chdir(tmp_path)
    exp = load_experiment(ROOT / "tune" / "fedprox_mu.yaml", ["federation.rounds=5"])  # the spec's grace period is 10
    assert (exp.max_rounds, exp.grace_period) == (5, 5)
    asha = scheduler(exp)  # Ray's own bounds check (grace_period <= max_t) passes
    assert asha._max_t == 5
    assert load_experiment(ROOT / "tune" / "fedprox_mu.yaml").grace_period == 10
    (tmp_path / "t.yaml").write_text(
        "base: {devices: {profile: phones.yaml}}\nsearch: {federation.rounds: {grid: [2, 3]}}\nscheduler: {name: "
        "asha, grace_period: 4}\n"
    )
    (tmp_path / "phones.yaml").write_text(PHONES.read_text())
    monkeypatch.chdir(ROOT)
    exp = load_experiment(tmp_path / "t.yaml")
    assert exp.base["devices"]["profile"] == str(tmp_path / "phones.yaml") and (exp.max_rounds, exp.grace_period) == (
        3,
        3,
    )


def test_the_catalog_lists_every_registered_name_and_only_those():
    from rayfl.data import sources
    from rayfl.models import families

    # rayfl's own summaries are written from their registrations: a stale copy fails here
    assert registry.LISTING.read_text() == registry.listing(), "python -m rayfl.algorithms"
    assert catalog.ALGORITHMS == {name: a.summary for name, a in registry.builtin().items()}
    assert set(catalog.ALGORITHMS) <= set(registry.algorithms())
    assert catalog.DATASETS == {name: s.summary for name, s in sources().items()}
    assert catalog.MODELS == {name: f.summary for name, f in families().items()}


def test_the_algorithms_page_has_a_row_for_every_built_in_algorithm_and_only_those():
    page = registry.PAGE.read_text()
    assert registry.with_table(page) == page, "python -m rayfl.algorithms"  # written from the registrations
    table = page.split(registry.TABLE_MARKS[0])[1].split(registry.TABLE_MARKS[1])[0].splitlines()
    named = [line.split("|")[1].strip(" `") for line in table if line.startswith("| `")]
    assert named == sorted(registry.builtin())


def test_rayfl_list_imports_no_torch_and_aligns_its_columns():
    code = "import sys; from rayfl.cli import main; main(['list']); print('torch' in sys.modules, file=sys.stderr)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr.strip() == "False"
    rows = [line for line in out.stdout.splitlines() if line.startswith("  ")]
    starts = {len(line) - len(line[2:].split("  ", 1)[1].lstrip()) for line in rows}
    assert len(rows) == len(catalog.ALGORITHMS) + len(catalog.DATASETS) + len(catalog.MODELS) + len(catalog.profiles())
    assert len(starts) == 1  # every summary in one column, the longest name (exclusivefl_depth) included


@pytest.mark.parametrize(
    "override, message",
    [
        ("federation.rouns=3", "federation.rouns: unknown key (did you mean 'rounds'?)"),
        ("data.partition.alpah=1", "data.partition.alpah: unknown key (did you mean 'alpha'?)"),
        ("algorithm.name=fedav", "algorithm.name: unknown algorithm 'fedav' (did you mean 'fedavg'?)"),
        ("devices.profile=jetsn", "devices.profile: 'jetsn' is neither"),
    ],
)
def test_unknown_keys_and_names_suggest_the_closest(override, message):
    from rayfl.devices import configured_profile

    with pytest.raises(ConfigError) as err:
        configured_profile(load_config(None, [override]).devices)  # a profile is read when the federation is built
    assert str(err.value).startswith(message)
    assert override != "devices.profile=jetsn" or str(err.value).endswith("(did you mean 'jetson'?)")


def test_an_unknown_names_list_of_known_ones_holds_whole_names_and_counts_the_rest():
    # 27 algorithms do not fit on a line: the list stops at a name's end and says how many are left
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.name=fedavgx"])
    said = str(err.value)
    assert said.startswith("algorithm.name: unknown algorithm 'fedavgx' (did you mean 'fedavg'?) (known: ")
    names, _, more = said.split("(known: ", 1)[1].removesuffix(")").partition(", and ")
    names, known = names.split(", "), sorted(registry.algorithms())  # (other tests may have added some)
    assert 5 < len(names) < len(known) and names == known[: len(names)]
    assert more == f"{len(known) - len(names)} more: rayfl list"


def test_heterogeneous_algorithms_take_their_profile_and_warn_when_it_collapses(rayfl_notes, tmp_path):
    from rayfl.engine import prepare

    assert load_config(None, ["algorithm.name=mfedepth"]).devices.profile == "fedepth_fair"
    assert load_config(None, ["algorithm.name=exclusivefl"]).devices.profile == "fedepth_fair"
    assert load_config(None, ["algorithm.name=mfedepth", "devices.profile=jetson"]).devices.profile == "jetson"
    assert load_config(None, ["algorithm.name=fedavg"]).devices.profile == "jetson"
    for overrides, warns in [
        (["algorithm.name=mfedepth"], False),
        (["algorithm.name=mfedepth", "devices.profile=jetson"], True),
        (["algorithm.name=exclusivefl", "devices.profile=jetson"], True),
        (["algorithm.name=exclusivefl"], False),
        (["algorithm.name=heterofl", "devices.profile=jetson"], False),  # dynamic levels: the profile plays no part
    ]:
        rayfl_notes.clear()
        prepare(load_config(None, overrides), tmp_path / "r")
        lines = list(rayfl_notes)
        assert bool(lines) == warns, (overrides, lines)
        if warns:
            assert len(lines) == 1 and lines[0].endswith(
                "so it runs as its baseline; its paper's setting: devices.profile=fedepth_fair"
            )


def test_a_run_out_to_a_uri_lands_there_and_resumes_from_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("rayfl.storage.HOME", tmp_path / "home")
    uri = f"file://{tmp_path}/store/run1"
    sets = [a for s in SMALL for a in ("--set", s)]
    assert main(["run", "--local", "--out", uri, *sets]) == 0
    assert len(pd.read_parquet(tmp_path / "store" / "run1" / "metrics.parquet")) == 1
    assert main(["run", "--local", "--resume", uri, "--set", "federation.rounds=2"]) == 0
    assert len(pd.read_parquet(tmp_path / "store" / "run1" / "metrics.parquet")) == 2
    assert (
        main(["run", "--local", "--out", "nosuch://x/y", *sets]) == 2
        and not (tmp_path / "home").joinpath("staging", "y").exists()
    )


@pytest.mark.parametrize(
    "sets, said",
    [
        (["algorithm.name=fedavg"], []),
        (["algorithm.name=mfedepth"], ["mfedepth takes its own devices.profile=fedepth_fair, model.name=preresnet20"]),
        (["algorithm.name=mfedepth", "devices.profile=jetson"], ["mfedepth takes its own model.name=preresnet20"]),
        (["algorithm.name=heterofl"], ["heterofl takes its own model.norm=sbn"]),
        (["algorithm.name=heterofl", "model.norm=bn"], []),
        (["algorithm.name=efedsup", "model.name=supernet_small", "federation.rounds=40"], ["efedsup in 40 rounds: "]),
        (["algorithm.name=efedsup", "model.name=supernet_small", "federation.rounds=41"], []),
    ],
)
def test_a_run_says_what_it_takes_from_its_algorithm_and_what_a_short_run_shows(sets, said):
    # what a run changes that it was not told to change is said in one line; E-FedSup's stall
    # (docs/fedsup.md) before a run too short to leave it
    from rayfl.cli import before_the_run
    from rayfl.config.files import with_overrides

    raw = with_overrides({}, sets)
    lines = before_the_run(raw, load_config(None, sets))
    assert len(lines) == len(said) and all(line.startswith(start) for line, start in zip(lines, said))
    assert all(line.endswith("(--set them to change)") for line in lines if "takes its own" in line)


def test_e_fedsup_with_its_defaults_says_so_on_screen_before_it_runs(tmp_path, capsys):
    # the README's line for any algorithm, as a user types it (one round here)
    args = ["run", "--local", "--set", "algorithm.name=efedsup", "--set", "federation.rounds=1"]
    assert main([*args, "--set", "federation.clients_per_round=2", "--out", str(tmp_path / "run")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rayfl: efedsup")]
    assert err == [
        "rayfl: efedsup takes its own model.name=supernet_small (--set them to change)",
        "rayfl: efedsup in 1 rounds: random sub-nets trained on labels alone keep its Big sub-net near chance for "
        "its first 20-40 rounds (docs/fedsup.md); its paper's setting learns in 200: rayfl run "
        "examples/fedsup/efedsup.yaml",
    ]

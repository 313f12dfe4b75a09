"""The README runs top to bottom: every bash block of its tour, the cluster and warm-cluster blocks
included, run as written, in order, in a fresh copy of the repository, with a home of its own (its
own token and kept head, started by the README's own `cluster/start-local-head.sh` and `rayfl up`).

Marked `slow` and left out of the README's test command (it takes minutes: every run of the tour
on a cluster of its own); `.ci/run` runs it with the other long drills: `python -m pytest -m slow`.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def tour_blocks(text: str) -> list[str]:
    """The bash blocks of the README's tour: from its heading to the next one."""
    section = text.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def fresh_copy(to: Path) -> Path:
    """The files git knows, as a clone has them (no runs, no caches)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    return to


def test_the_readme_tour_runs_as_written(tmp_path):
    blocks = tour_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 3 and any("start-local-head.sh" in b for b in blocks) and any("rayfl up" in b for b in blocks)
    repo, home = fresh_copy(tmp_path / "repo"), tmp_path / "home"
    home.mkdir()
    bin_dir = str(Path(sys.executable).parent)  # rayfl and ray beside this interpreter
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        env.pop(key, None)
    try:
        for block in blocks:
            script = "set -euo pipefail\n" + "\n".join(
                f"echo {shlex.quote('+ ' + line)} >&2\n{line}" for line in block.strip().splitlines()
            )
            done = subprocess.run(
                ["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=1800
            )
            assert done.returncode == 0, f"{block}\n--- stderr ---\n{done.stderr[-4000:]}"
    finally:  # a head a failed block left up: that head only (never `ray stop`)
        subprocess.run([sys.executable, "-m", "rayfl", "down"], cwd=repo, env=env, capture_output=True, timeout=120)
    runs = repo / "runs"
    assert {"fedavg", "heterofl", "compare"} <= {p.name for p in runs.iterdir()}
    assert (runs / "heterofl" / "timeline.png").is_file() and (runs / "compare" / "compare.md").is_file()
    fetched = [p for p in runs.iterdir() if p.name.startswith("rayfl-fedavg-digits-")]
    assert len(fetched) == 1 and (fetched[0] / "metrics.parquet").is_file()  # `--fetch` lands under runs/
    ignored = subprocess.run(["git", "check-ignore", "-q", f"runs/{fetched[0].name}"], cwd=ROOT)
    assert ignored.returncode == 0  # git never sees fetched runs, nor does a job's upload (rayfl.upload.EXCLUDES)

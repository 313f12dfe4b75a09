"""`rayfl down` under a run, TRIES times: `python -m tests.actors.down_drill [TRIES]` (default 20).

Each try starts a kept head (`rayfl up`, a HOME and Ray temp folder of its own), a run on it
(the mlp, 100000 rounds, a checkpoint each round), and once the first checkpoint is written, `rayfl
down`. The run must end with exit 1 and the one line that says how to continue it, every time
(issue 53: it was lost 1 time in 10 when Ray's core worker ended the process first;
`actors.driver.head.HeadStopping`). Prints a line a try and a summary; exits 1 unless every try
printed the line. `tests/actors/test_warm.py` holds one try in the slow suite.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.actors.drills import a_long_run

LINE = "rayfl: run failed: the cluster stopped under the run (rayfl down stopped its head); continue it with: "


def one_try(root: Path) -> tuple[bool, str]:
    """(whether the run ended with exit 1 and the line, the run's last stderr lines)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"], env["RAY_TMPDIR"] = str(root / "home"), tempfile.mkdtemp(prefix="r", dir="/tmp")
    rayfl = [sys.executable, "-m", "rayfl"]
    try:
        subprocess.run([*rayfl, "up", "--num-cpus", "2"], env=env, check=True, capture_output=True, timeout=300)
        going = root / "run"
        run = a_long_run(going, env)
    finally:
        subprocess.run([*rayfl, "down"], env=env, capture_output=True, timeout=300)
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    err = run.communicate(timeout=300)[1]
    lines = [line for line in err.splitlines() if line.startswith("rayfl: run failed")]
    return run.returncode == 1 and lines == [f"{LINE}rayfl run --resume {going}"], "\n".join(err.splitlines()[-3:])


def main(tries: int) -> int:
    printed = 0
    for k in range(1, tries + 1):
        with tempfile.TemporaryDirectory() as root:
            ok, tail = one_try(Path(root))
        printed += ok
        print(f"try {k}: {'the line' if ok else 'NO LINE: ' + tail}", flush=True)
    print(f"rayfl down under a run: {printed} of {tries} printed the line")
    return 0 if printed == tries else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))

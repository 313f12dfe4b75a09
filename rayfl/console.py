"""What a run shows on the terminal: a bar of rounds (or a job's per-round lines, which `rayfl submit
--wait` draws as a bar again), Ray's cluster notices as one `rayfl:` line each, and a job's log as
`rayfl submit --wait` shows it (`Quiet`)."""

from __future__ import annotations

import io
import logging
import math
import re
import sys
from typing import Any, Callable, Mapping, TextIO

PROGRESS_LINE = re.compile(r"^rayfl: round (\d+)/(\d+) acc (\S+) vtime (\S+)s\s*$")
"""The line a run inside a job prints per round (`--progress lines`); `wait` turns it into a bar."""


class Quiet:
    """A job's log lines as `rayfl submit --wait` shows them: the run's per-round lines as a bar,
    its `rayfl:` notices and its last line (RUN_DIR and accuracy) as they are, the rest (Ray's
    INFO lines, the config) dropped."""

    def __init__(self, write: Callable[[str], Any]):
        self.write, self.bar = write, None

    def __call__(self, line: str) -> None:
        from tqdm import tqdm

        step = PROGRESS_LINE.match(line)
        if step:
            done, total, acc, vtime = step.groups()
            if self.bar is None:
                self.bar = tqdm(total=int(total), initial=int(done) - 1, unit="round", dynamic_ncols=True)
            self.bar.set_postfix(acc=acc, vtime=f"{float(vtime):.0f}s", refresh=False)
            self.bar.update(1)
        elif line.startswith("rayfl: ") or ": final test accuracy " in line:
            self.close()
            self.write(line + "\n")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class ProgressBar:
    """A tqdm bar of rounds with accuracy and virtual time, opened at the first finished round
    (a resumed run's bar starts at the rounds it already has). With `lines`, one `rayfl: round
    r/R acc A vtime T s` line per round on stderr instead: a job's progress, which `rayfl submit
    --wait` draws as a bar (`PROGRESS_LINE`, `Quiet`)."""

    def __init__(self, total: int, lines: bool = False):
        self.total, self.lines = total, lines
        self.bar = None

    def __call__(self, row: Mapping[str, Any]) -> None:
        from tqdm import tqdm

        acc = row["test_accuracy"]
        if self.lines:
            print(
                f"rayfl: round {row['round']}/{self.total} acc {'-' if math.isnan(acc) else f'{acc:.4f}'} vtime "
                f"{row['virtual_time_s']:.1f}s",
                file=sys.stderr,
                flush=True,
            )
            return
        if self.bar is None:
            self.bar = tqdm(total=self.total, initial=row["round"] - 1, unit="round", dynamic_ncols=True)
        self.bar.set_postfix(
            acc="-" if math.isnan(acc) else f"{acc:.3f}", vtime=f"{row['virtual_time_s']:.0f}s", refresh=False
        )
        self.bar.update(1)  # the count and this round's figures appear together

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class RayNotices(io.TextIOBase):
    """This process's stdout while a run is on Ray. Ray's driver prints its cluster notices there
    (`(raylet) A worker died ...`, from its error listener); each becomes one `rayfl:` line on
    stderr (the run handles what it reports: a dead client's task is retried), the rest passes."""

    def __init__(self, stdout: TextIO, log: logging.Logger):
        self.stdout, self.log, self.pending = stdout, log, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            plain = re.sub(r"\x1b\[[0-9;]*m", "", line)  # Ray colours the prefix
            if plain.startswith("(raylet)"):
                self.log.warning(f"Ray: {plain.removeprefix('(raylet)').strip().split('. ')[0]}")
            else:
                self.stdout.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stdout.flush()

"""What a job ships: the repository as Ray's `working_dir`, measured before it is submitted.

A Ray dashboard takes at most `UPLOAD_LIMIT` in one request; a larger working dir got a bare HTTP
`413` back (`rayfl submit` named neither the upload nor the file). `rayfl.api.submit` and
`pool_command_on` pass `upload_excludes` as the runtime env's `excludes`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .config import ConfigError, shown

EXCLUDES = ["runs/", ".git/", "**/__pycache__/", "*.egg-info/", "site/"]
"""What a job's upload of this repository leaves out (its runs, fetched ones included)."""
UPLOAD_LIMIT = 100 * 2**20
"""The most a Ray dashboard takes in one request (`ray_constants.DASHBOARD_CLIENT_MAX_SIZE`): a
larger working dir got a bare `413` back."""


def upload_excludes(root: Path, limit: int = UPLOAD_LIMIT) -> list[str]:
    """`EXCLUDES` plus every file of the job's upload of `root` that alone is over `limit` (said in
    one line on stderr); `ConfigError`, one line naming the largest files and the limit, when the
    rest is still over it. The upload is what Ray packs: the files git does not ignore, tracked or
    not (Ray honours `.gitignore`, which holds `EXCLUDES`; outside a git checkout or without git,
    every file). Measured before compression, so a working dir refused here is one the dashboard
    could refuse."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root, capture_output=True
        )
    except OSError:  # no git on this machine: every file counts
        listed = subprocess.CompletedProcess([], returncode=1)
    if listed.returncode == 0:
        files = [root / name for name in listed.stdout.decode().split("\0") if name]
    else:
        files = [p for p in root.rglob("*") if ".git" not in p.relative_to(root).parts]
    sizes = {p.relative_to(root).as_posix(): p.stat().st_size for p in files if p.is_file()}
    mib = lambda size: f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size} bytes"
    largest = lambda of: ", ".join(f"{shown(n, 80)} ({mib(of[n])})" for n in sorted(of, key=of.get, reverse=True)[:3])
    too_big = {n: size for n, size in sizes.items() if size > limit}
    if too_big:
        print(
            f"rayfl: left out of the job's upload, each over the dashboard's {mib(limit)}: {largest(too_big)}",
            file=sys.stderr,
        )
    rest = {n: size for n, size in sizes.items() if size <= limit}
    if sum(rest.values()) > limit:
        raise ConfigError(
            f"{root}: the job's upload (the files git does not ignore) is {mib(sum(rest.values()))}, over the "
            f"dashboard's {mib(limit)}; the largest: {largest(rest)}: add them to .gitignore or .rayignore, or move "
            "them out"
        )
    return [*EXCLUDES, *(f"/{n}" for n in too_big)]

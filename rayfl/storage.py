"""Where a run's RUN_DIR lives: a local folder, or a URI (`s3://`, `gs://`, `file://`, ...) through
`pyarrow.fs`, the layer Ray Train and Tune store results through.

A run whose `--out` is a URI writes to a local staging folder (`~/rayfl/staging/<name>`) and
copies it to the URI when it ends, however it ends, so a failed run's rows and checkpoints are
kept too; `--resume URI` first copies the URI back. Inside a Ray job, a run given no `--out`
lands in `~/rayfl/runs/<submission id>` on the node that runs the job (the head), an absolute
folder that outlives Ray's session, unlike the job's temporary working dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from .config import RunConfig

HOME = Path("~/rayfl").expanduser()


def is_uri(location: str | os.PathLike | None) -> bool:
    return location is not None and "://" in str(location)


def job_submission_id() -> str | None:
    """The submission id of the Ray job this process is the driver of (None outside a job)."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return None
    return json.loads(raw).get("metadata", {}).get("job_submission_id")


def copy_tree(source: str, destination: str) -> None:
    """Copy a folder between any two of local paths and URIs (`pyarrow.fs.copy_files`)."""
    from pyarrow import fs

    if not is_uri(source):
        source = str(Path(source).resolve())
    if not is_uri(destination):
        Path(destination).mkdir(parents=True, exist_ok=True)
        destination = str(Path(destination).resolve())
    fs.copy_files(source, destination)


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write `data` to `path` as a whole or not at all: into a hidden `.NAME.<pid>-<hex>.tmp` beside it, then
    renamed over it, so a full disk or a kill mid-write never leaves a partial file under the
    final name (a reader sees the old file or the new one). On an `OSError` (`ENOSPC`, `EACCES`,
    ...) the partial file is removed and the error names `path` itself."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(3)}.tmp")  # two writers never share one
    with naming(path):
        try:
            with open(tmp, "wb") as out:
                out.write(data.encode() if isinstance(data, str) else data)
                out.flush()
                os.fsync(out.fileno())  # on disk before the rename makes it the file
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
    return path


@contextlib.contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """An `OSError` inside is raised again naming `path` with its cause (`[Errno 28] No space left
    on device: 'PATH'`), whatever file the failing call named, if any."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


def uri_exists(uri: str) -> bool:
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(uri)
    return filesystem.get_file_info(path).type != fs.FileType.NotFound


@contextlib.contextmanager
def located(location: str | None, resume: bool) -> Iterator[Path | None]:
    """The local RUN_DIR a run writes to: `location` itself (a folder; None when not given), or a
    staging folder for a URI, copied to the URI when the run ends (and, with `resume`, copied
    from it first)."""
    if not is_uri(location):
        yield Path(location) if location else None
        return
    name = str(location).rstrip("/").rsplit("/", 1)[-1]
    staging = HOME / "staging" / name
    if resume:
        copy_tree(str(location), str(staging))
    try:
        yield staging
    finally:
        if staging.is_dir():
            copy_tree(str(staging), str(location))


RUN_FILES = ("config.yaml", "metrics.parquet", "checkpoints")
"""What marks a folder as a RUN_DIR."""


def holds_run(location: str) -> bool:
    """Whether the folder or URI `location` holds a run (its config, rows or checkpoints)."""
    if is_uri(location):
        return any(uri_exists(f"{str(location).rstrip('/')}/{name}") for name in RUN_FILES)
    return any((Path(location).expanduser() / name).exists() for name in RUN_FILES)


def check_location(location: str | None, label: str = "--out") -> None:
    """`ConfigError` naming `label` for a URI no `pyarrow.fs` filesystem reads, or a folder path
    that cannot be looked up (`rayfl.config.files.checked_path`: a symlink loop, a name too long);
    found before a run starts."""
    if location is None:
        return
    if not is_uri(location):
        from .config.files import checked_path

        checked_path(location, label)
        return
    from pyarrow import fs

    from .config import ConfigError

    try:
        fs.FileSystem.from_uri(str(location))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, ValueError or OSError by scheme
        raise ConfigError(f"{label}: {location}: {str(exc).splitlines()[0]}") from None


def dump_config(config: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (`write_atomic`: never half a file); `load_config(path)`
    gives back an equal object."""
    import yaml

    from .config import to_dict

    write_atomic(path, yaml.safe_dump(to_dict(config), sort_keys=False))

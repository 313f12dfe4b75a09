"""Command line: `rayfl run | tune | list | compare | submit | fetch | up | down | pool` (console script `rayfl`, also `python -m rayfl`).

Exit codes: 0 on success, 2 on bad input (one line on stderr naming the field or file),
1 on a failure during the run. No traceback unless `--debug`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from .config import ConfigError, shown


class ProgressBar:
    """A tqdm bar of rounds with accuracy and virtual time, opened at the first finished round
    (a resumed run's bar starts at the rounds it already has). With `lines`, one `rayfl: round
    r/R acc A vtime T s` line per round on stderr instead: a job's progress, which `rayfl submit
    --wait` draws as a bar (`rayfl.api.PROGRESS_LINE`)."""

    def __init__(self, total: int, lines: bool = False):
        self.total, self.lines = total, lines
        self.bar = None

    def __call__(self, row: Mapping[str, Any]) -> None:
        from tqdm import tqdm

        acc = row["test_accuracy"]
        if self.lines:
            print(
                f"rayfl: round {row['round']}/{self.total} acc {'-' if math.isnan(acc) else f'{acc:.4f}'} vtime {row['virtual_time_s']:.1f}s",
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


def _config(args: argparse.Namespace, resume_dir: Path | None = None):
    """The run's config; with `--resume`, RUN_DIR's own (`resume_dir`: where it is staged here)."""
    from .config.files import parse_yaml
    from .config.load import load_config, parse_config, with_overrides

    if getattr(args, "resume", None):
        if args.config:
            raise ConfigError(f"--resume {args.resume}: takes the run's own config.yaml; drop {args.config}")
        return load_config(Path(resume_dir or args.resume) / "config.yaml", args.set)
    if getattr(args, "config_env", None) is not None:  # a submitted job's config (rayfl.api.submit)
        return parse_config(
            with_overrides(parse_yaml(os.environ.get(args.config_env, ""), f"${args.config_env}") or {}, args.set)
        )
    return load_config(args.config, args.set)


def cmd_run(args: argparse.Namespace) -> int:
    from . import storage

    location = args.resume or args.out
    storage.check_location(location)
    job = storage.job_submission_id()
    resume = bool(args.resume)
    with storage.located(location, resume) as staged:
        config = _config(args, staged)
        from .engine import new_run_dir
        from .runner import run_local

        run_dir = staged or (
            storage.HOME / "runs" / job if job else new_run_dir(config)
        )  # a job's run outlives its temporary working dir
        shown = (
            location if storage.is_uri(location) else run_dir.resolve() if job else run_dir
        )  # a job's is absolute: it is read from elsewhere
        if job:
            print(f"rayfl: RUN_DIR {shown}", file=sys.stderr, flush=True)
        bar = ProgressBar(config.federation.rounds, lines=args.progress == "lines")
        try:
            from . import api

            if args.local:
                try:
                    summary = run_local(config, run_dir, progress=bar, resume=resume)
                except ConfigError:
                    raise
                except Exception as exc:  # noqa: BLE001 - one line with the resume hint, as on Ray
                    raise api.broke_off(exc, Path(run_dir)) from exc
            else:
                with contextlib.redirect_stdout(RayNotices(sys.stdout, logging.getLogger("rayfl"))):
                    summary = api.run(config, run_dir, address=args.address, progress=bar, resume=resume)
        finally:
            bar.close()
    acc = summary["final_test_accuracy"]
    print(f"{shown}: final test accuracy {acc:.4f}, virtual time {summary['virtual_time_s']:.1f} s")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """The catalog (`rayfl/catalog.py`): no torch import, so it answers at once; algorithms of other
    packages (the entry point group `rayfl.algorithms`) are imported to read their summaries."""
    from importlib import metadata

    from . import catalog

    algorithms = dict(catalog.ALGORITHMS)
    if metadata.entry_points(group=catalog.PLUGINS):
        from .algorithms import registry

        algorithms.update((name, a.summary) for name, a in registry.algorithms().items())

    profiles = {}
    for name, prof in catalog.profiles().items():
        mix = ", ".join(f"{c['name']} {c.get('proportion', 1):g}" for c in prof["classes"])
        profiles[name] = f"{mix}; " + (
            f"modes re-drawn every {prof['mode_period']} rounds" if prof.get("mode_period") else "fixed modes"
        )
    tables = {
        "algorithms": algorithms,
        "datasets": catalog.DATASETS,
        "models": catalog.MODELS,
        "device profiles": profiles,
    }
    width = max(len(name) for table in tables.values() for name in table)
    for title, table in tables.items():
        print(f"{title}:")
        for name, summary in sorted(table.items()):
            print(f"  {name:<{width}}  {summary}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .compare import compare

    text, written = compare(args.run_dirs, args.out, target=args.target, last=args.last, columns=args.column)
    print(text)
    print(f"{args.out}: {', '.join(p.name for p in written)}")
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    from .timeline import draw

    print(draw(args.run_dir, args.out, args.rounds))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from . import api, storage

    config = _config(args)
    address = api.validate_address(args.address)
    storage.check_location(args.out)
    job = api.submit(config, address, out=args.out, verbose=args.verbose)
    print(job, flush=True)
    if not args.wait:
        print(
            f"rayfl: follow it on the dashboard's Jobs page; fetch its RUN_DIR with: rayfl fetch {job} --address {address}",
            file=sys.stderr,
        )
        return 0
    status = api.wait(address, job, verbose=args.verbose)
    if args.fetch and status == 0:
        print(f"{api.fetch(address, job, args.to)}: fetched")
    return status


def cmd_fetch(args: argparse.Namespace) -> int:
    from . import api

    print(f"{api.fetch(api.validate_address(args.address), args.job, args.to, args.client_port)}: fetched")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from tune.run import run_experiment
    from tune.spec import load_experiment

    exp = load_experiment(args.tune, args.set)  # every search spec checked before Ray starts
    out = run_experiment(exp, resume=args.resume, address=args.address, verbose=args.verbose)
    table, best = out["table"], out["best"]
    metric = f"final_{exp.spec.metric}"
    print(table.drop(columns=["run_dir"]).to_string(index=False))
    print(f"{exp.dir}: results.csv, results.parquet, trials.png")
    if (table["status"] == "unfinished").any():
        print(f"interrupted: rayfl tune {args.tune} --resume finishes it", file=sys.stderr)
        return 130
    if best is None:
        print("no trial finished all its rounds: no best.yaml")
        return 1
    print(f"best trial {best['trial_id']}: {metric} {best[metric]:.4f}; config {exp.dir / 'best.yaml'}")
    return 0


def cmd_traces(args: argparse.Namespace) -> int:
    from .devices.trace import generate_trace, load_trace, write_trace

    if args.action == "generate":
        if args.devices < 1 or args.days < 1:
            raise ConfigError(f"--devices {args.devices} --days {args.days}: both must be at least 1")
        devices, intervals = generate_trace(args.devices, args.seed, args.days)
    else:
        from .devices.fedscale import import_fedscale

        devices, intervals = import_fedscale(args.capacity, args.behaviour, args.reference_flops, args.memory_mb)
    out = write_trace(devices, intervals, args.out)
    trace = load_trace(out, need_intervals=True)
    print(f"{out}: {len(trace.devices)} devices, {len(trace.intervals)} online intervals (devices.trace: {out})")
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    """`rayfl up | down | pool` (actors/driver/head.py, actors/driver/pool.py)."""
    from actors.driver import head

    if args.command == "up":
        record = head.up(args.num_cpus, args.num_gpus, args.dashboard)
        dashboard = f", dashboard {record['dashboard']}" if record["dashboard"] else ""
        print(
            f"rayfl: a local Ray head is up at {record['address']}{dashboard}; rayfl run and tune join it until: rayfl down"
        )
    elif args.command == "down":
        print("rayfl: the local head is down" if head.down() else "rayfl: no local head was up")
    else:
        if not head.joining(args.address):
            raise ConfigError(
                "rayfl pool: no running cluster: give --address HOST:PORT, set RAY_ADDRESS, or start one with rayfl up"
            )
        from actors.driver.cluster import connect
        from actors.driver.pool import pool_command

        connect(args.address, dashboard=False)
        print(pool_command(args.action))
    return 0


class Parser(argparse.ArgumentParser):
    """Whole option names only (an abbreviation such as ``--config`` must not silently mean the hidden
    ``--config-env``), and a usage error is one line, exit 2, like every other bad input."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:
        self.exit(2, f"rayfl: error: {message}\n")


def add_jobs(sub: argparse._SubParsersAction) -> None:
    """`rayfl submit` and `rayfl fetch` (rayfl/api.py)."""
    submit = sub.add_parser("submit", help="submit a run to a Ray cluster as a job")
    submit.add_argument("config", nargs="?", help="config YAML")
    submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    submit.add_argument("--address", required=True, help="the cluster's dashboard, http://HOST:8265")
    submit.add_argument(
        "--out", help="RUN_DIR: a folder on the head or a URI (s3://, gs://; default ~/rayfl/runs/<job id> on the head)"
    )
    submit.add_argument(
        "--wait", action="store_true", help="follow the job (a bar of rounds) and return its exit status"
    )
    submit.add_argument("--fetch", action="store_true", help="with --wait: then copy the RUN_DIR here (as rayfl fetch)")
    submit.add_argument("--to", metavar="DIR", help="with --fetch: where to (default ./<job id>)")
    submit.add_argument(
        "--verbose", action="store_true", help="Ray's log lines; with --wait, every log line of the job"
    )
    submit.set_defaults(func=cmd_submit)

    fetch = sub.add_parser("fetch", help="copy a submitted run's RUN_DIR to this machine")
    fetch.add_argument("job", metavar="JOB_ID")
    fetch.add_argument("--address", required=True, help="the cluster's dashboard, http://HOST:8265")
    fetch.add_argument("--to", metavar="DIR", help="where to (default ./<RUN_DIR name>)")
    fetch.add_argument(
        "--client-port",
        type=int,
        default=10001,
        help="the head's Ray Client port, for a RUN_DIR only the cluster reads (default 10001)",
    )
    fetch.set_defaults(func=cmd_fetch)


def add_cluster(sub: argparse._SubParsersAction) -> None:
    """`rayfl up`, `rayfl down` and `rayfl pool status | drain` (docs/ray.md, "Warm clusters")."""
    up = sub.add_parser("up", help="start a local Ray head kept between runs (their actors stay warm)")
    up.add_argument("--num-cpus", type=int, help="CPUs it offers (default: this machine's)")
    up.add_argument("--num-gpus", type=int, help="GPUs it offers (default: those Ray finds)")
    up.add_argument("--dashboard", action="store_true", help="with the dashboard on 127.0.0.1")
    sub.add_parser("down", help="stop the local head rayfl up started").set_defaults(func=cmd_cluster)
    up.set_defaults(func=cmd_cluster)
    pool = sub.add_parser("pool", help="the cluster's warm actors: status, or drain the idle ones")
    pool.add_argument("action", choices=["status", "drain"])
    pool.add_argument("--address", help="the cluster (default: $RAY_ADDRESS, else the head rayfl up keeps)")
    pool.set_defaults(func=cmd_cluster)


def add_traces(sub: argparse._SubParsersAction) -> None:
    """`rayfl traces generate | import-fedscale`."""
    traces = sub.add_parser(
        "traces", help="device traces: generate a synthetic one, or import FedScale's (docs/devices.md)"
    )
    actions = traces.add_subparsers(dest="action", required=True)
    gen = actions.add_parser("generate", help="write a realistic synthetic trace (no network needed)")
    gen.add_argument("--devices", type=int, required=True, metavar="N")
    gen.add_argument("--days", type=int, default=7, help="days of diurnal intervals (they repeat after; default 7)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", required=True, metavar="DIR")
    fs = actions.add_parser(
        "import-fedscale", help="convert FedScale's client_device_capacity and client_behave_trace pickles"
    )
    fs.add_argument("capacity", metavar="CAPACITY_FILE")
    fs.add_argument("behaviour", metavar="BEHAVE_FILE")
    fs.add_argument("--out", required=True, metavar="DIR")
    fs.add_argument(
        "--reference-flops",
        type=float,
        default=6.0e8,
        help="forward FLOPs per sample of the model FedScale's latencies stand for (default MobileNetV2's)",
    )
    fs.add_argument(
        "--memory-mb", type=float, default=1024.0, help="every device's memory budget, MiB (FedScale's files have none)"
    )
    traces.set_defaults(func=cmd_traces)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rayfl", description="Federated learning over heterogeneous devices on Ray")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one federation (the embedded default without CONFIG)")
    run.add_argument("config", nargs="?", help="config YAML")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    run.add_argument(
        "--out",
        help="RUN_DIR: a folder or a URI (s3://, gs://, file://; default runs/<time>-<algorithm>-<dataset>, in a Ray job ~/rayfl/runs/<job id>)",
    )
    run.add_argument(
        "--resume", metavar="RUN_DIR", help="continue RUN_DIR from its newest checkpoint (--set may extend rounds)"
    )
    run.add_argument(
        "--address",
        help="join this Ray cluster (default: $RAY_ADDRESS, else the head rayfl up keeps, else start a local one)",
    )
    run.add_argument("--local", action="store_true", help="run in this process without Ray (the reference runner)")
    run.add_argument("--config-env", help=argparse.SUPPRESS)
    run.add_argument("--progress", choices=["bar", "lines"], default="bar", help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_run)

    add_jobs(sub)

    tune = sub.add_parser("tune", help="search a federation's hyperparameters and device mixes with Ray Tune")
    tune.add_argument("tune", metavar="TUNE", help="TUNE.yaml: a base run config, a search section, metric, scheduler")
    tune.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of the base run config"
    )
    tune.add_argument("--resume", action="store_true", help="restore the interrupted experiment and finish it")
    tune.add_argument(
        "--address",
        help="join this Ray cluster (default: $RAY_ADDRESS, else the head rayfl up keeps, else start a local one)",
    )
    tune.add_argument(
        "--verbose",
        action="store_true",
        help="Tune's status tables and Ray's log lines (default: a bar of trials and the final table)",
    )
    tune.set_defaults(func=cmd_tune)

    sub.add_parser("list", help="algorithms, datasets, models and device profiles").set_defaults(func=cmd_list)

    compare = sub.add_parser("compare", help="runs side by side: a table (seeds of a config pooled) and accuracy plots")
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    compare.add_argument(
        "--target",
        type=float,
        metavar="ACC",
        help="accuracy for time / rounds to target (default: each run's federation.target_accuracy)",
    )
    compare.add_argument(
        "--last",
        type=int,
        default=1,
        metavar="K",
        help="final accuracy: the mean of the last K evaluated rounds (default 1)",
    )
    compare.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="NAME",
        help="add the mean over rounds of this metrics.parquet column (e.g. kl)",
    )
    compare.add_argument(
        "--out", default="compare", help="folder for compare.csv, compare.md and the PNGs (default: ./compare)"
    )
    compare.set_defaults(func=cmd_compare)

    timeline = sub.add_parser(
        "timeline", help="a run's virtual clock as a Gantt chart (and the staleness of an async run's updates)"
    )
    timeline.add_argument("run_dir", metavar="RUN_DIR")
    timeline.add_argument("--rounds", metavar="A-B", help="only these rounds (server steps), e.g. 1-5 (default: all)")
    timeline.add_argument("--out", metavar="FILE", help="the PNG to write (default: RUN_DIR/timeline.png)")
    timeline.set_defaults(func=cmd_timeline)

    add_traces(sub)
    add_cluster(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log = logging.getLogger("rayfl")  # rayfl's notices (a checkpoint passed over, actors pending): one line each
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("rayfl: %(message)s"))
    log.handlers = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        return args.func(args)
    except ConfigError as exc:
        if args.debug:
            raise
        print(f"rayfl: error: {shown(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rayfl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a failure during the run: one line, exit 1
        if args.debug:
            raise
        if type(exc).__name__ == "RunFailed":  # one line already, its cause cut, its resume hint whole
            print(f"rayfl: run failed: {exc}", file=sys.stderr)
        else:
            print(
                f"rayfl: run failed: {shown((f'{type(exc).__name__}: {exc}'.splitlines() or [''])[0])}", file=sys.stderr
            )
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""Command line: `rayfl run | tune | list | compare | timeline | traces | submit | fetch | up | down | pool`
(console script `rayfl`, also `python -m rayfl`); the grammar is `rayfl.arguments`.

Exit codes: 0 on success, 2 on bad input (one line on stderr naming the field or file),
1 on a failure during the run. No traceback unless `--debug`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from tqdm.contrib.logging import logging_redirect_tqdm

from .arguments import build_parser
from .config import ConfigError, shown


def _config(args: argparse.Namespace, resume_dir: Path | None = None):
    """The run's config; with `--resume`, RUN_DIR's own (`resume_dir`: where it is staged here). A
    misspelt key of the generic sections is reported before the registries (and torch) load."""
    from .config.files import check_known_keys, parse_yaml, read_config, with_overrides
    from .resume import RESUMABLE, computation_changes

    if getattr(args, "resume", None):
        if args.config:
            raise ConfigError(f"--resume {args.resume}: takes the run's own config.yaml; drop {args.config}")
        saved = read_config(Path(resume_dir or args.resume) / "config.yaml")
    elif getattr(args, "config_env", None) is not None:  # a submitted job's config (rayfl.api.submit)
        saved = parse_yaml(os.environ.get(args.config_env, ""), f"${args.config_env}") or {}
    else:
        saved = read_config(args.config) if args.config else {}
    raw = with_overrides(saved, args.set)
    check_known_keys(raw)
    from .load import parse_config

    if getattr(args, "resume", None):
        changes = computation_changes(saved, raw)
        if changes:
            key, own, asked = changes[0]
            allowed = ", ".join(k if "." in k else f"{k}.*" for k in RESUMABLE)
            raise ConfigError(
                f"{key}: a resumed run keeps its own ({shown(str(own), 80)}); --resume changes only {allowed}: start a "
                f"new run for {shown(str(asked), 80)}"
            )
    config = parse_config(raw)
    if not getattr(args, "resume", None):
        for line in before_the_run(raw, config):
            print(f"rayfl: {line}", file=sys.stderr)
    return config


def before_the_run(raw: dict, config) -> list[str]:
    """What a new run says before it starts: the settings it takes from its algorithm where the
    config leaves them unset (`rayfl.load.algorithm_setting`), and what to know of a run
    this short (`Algorithm.short_runs`)."""
    from .load import algorithm_setting

    name, lines = config.algorithm.name, []
    taken = algorithm_setting(raw)
    if taken:
        lines.append(f"{name} takes its own {', '.join(f'{k}={v}' for k, v in taken.items())} (--set them to change)")
    short = config.algorithm.record.short_runs
    if short is not None and config.federation.rounds <= short[0]:
        lines.append(f"{name} in {config.federation.rounds} rounds: {short[1]}")
    return lines


def cmd_run(args: argparse.Namespace) -> int:
    from . import storage

    location = args.resume or args.out
    storage.check_location(location, "--resume" if args.resume else "--out")
    if args.out and not args.resume and not args.overwrite and storage.holds_run(args.out):
        raise ConfigError(
            f"--out {shown(args.out)}: holds a run; continue it with --resume {shown(args.out)}, or replace it with "
            "--overwrite"
        )
    job = storage.job_submission_id()
    resume = bool(args.resume)
    with storage.located(location, resume) as staged:
        config = _config(args, staged)
        from .engine import new_run_dir
        from .runner import run_local

        run_dir = staged or (
            storage.HOME / "runs" / job if job else new_run_dir(config)
        )  # a job's run outlives its temporary working dir
        where = (
            location if storage.is_uri(location) else run_dir.resolve() if job else run_dir
        )  # a job's is absolute: it is read from elsewhere
        if job:
            print(f"rayfl: RUN_DIR {where}", file=sys.stderr, flush=True)
        from .console import ProgressBar, RayNotices

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
        except KeyboardInterrupt:
            bar.close()
            print(f"rayfl: interrupted; {api.resume_hint(Path(run_dir))}", file=sys.stderr)
            return 130
        finally:
            bar.close()
    acc = summary["final_test_accuracy"]
    print(f"{where}: final test accuracy {acc:.4f}, virtual time {summary['virtual_time_s']:.1f} s")
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
    from actors.driver import head

    from . import api, storage

    config = _config(args)
    address = api.validate_address(head.dashboard(args.address))
    storage.check_location(args.out)
    job = api.submit(config, address, out=args.out, verbose=args.verbose)
    print(job, flush=True)
    if not args.wait:
        print(
            f"rayfl: follow it on the dashboard's Jobs page; fetch its RUN_DIR with: rayfl fetch {job} --address "
            f"{address}",
            file=sys.stderr,
        )
        return 0
    status = api.wait(address, job, verbose=args.verbose)
    if args.fetch and status == 0:
        print(f"{api.fetch(address, job, args.to)}: fetched")
    return status


def cmd_fetch(args: argparse.Namespace) -> int:
    from actors.driver import head

    from . import api

    address = api.validate_address(head.dashboard(args.address))
    print(f"{api.fetch(address, args.job, args.to, args.client_port)}: fetched")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from actors.driver.head import joining
    from tune.spec import load_experiment

    exp = load_experiment(args.tune, args.set)  # every search spec checked before Ray starts
    joining(args.address or exp.base_config.ray.address)  # before Ray's import (a cluster of its own on the loopback)
    from tune.run import run_experiment

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
    print(
        f"best trial {best['trial_id']} (the best {metric} of the trials that ran all their rounds): "
        f"{best[metric]:.4f}; config {exp.dir / 'best.yaml'}"
    )
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
        with_dashboard = bool(args.dashboard or args.dashboard_port or args.env)
        record = head.up(
            args.num_cpus, args.num_gpus, with_dashboard, args.dashboard_port, node_ip_address=args.node_ip_address
        )
        if args.env:  # the one line a shell evaluates: this head's, whatever the shell holds now
            if not record["dashboard"]:
                raise ConfigError(
                    "rayfl up --env: the head it keeps has no dashboard (rayfl down, then rayfl up --env)"
                )
            print(head.shell_exports(record))
            return 0
        joined = "rayfl run and tune join it (warm actors) until: rayfl down"
        print(f"rayfl: a local Ray head is up at {record['address']}; {joined}")
        if args.node_ip_address:
            print(
                f"its ports are open to the network: other nodes join with RAY_AUTH_MODE=token, this host's token "
                f"(ray get-auth-token) and: ray start --address {record['address']}"
            )
        if record["dashboard"]:
            taken = args.dashboard_port and not record["dashboard"].endswith(f":{args.dashboard_port}")
            print(
                f"dashboard: {record['dashboard']} (rayfl submit, fetch and pool take it as --address)"
                + (f"; {args.dashboard_port} was taken" if taken else "")
            )
            print("the browser asks for a token: paste the output of: ray get-auth-token")
        print(
            'for Ray\'s own CLI in your shell: eval "$(rayfl up --env)", then '
            f"ray status --address {record['address']}, ray job submit ..."
        )
    elif args.command == "down":
        print("rayfl: the local head is down" if head.down() else "rayfl: no local head was up")
    else:
        if args.address and args.address.startswith(("http://", "https://")):  # a dashboard, as submit takes
            from . import api

            print(api.pool_command_on(api.validate_address(args.address), args.action))
            return 0
        if not head.joining(args.address):
            raise ConfigError(
                "rayfl pool: no running cluster: give --address HOST:PORT, set RAY_ADDRESS, or start one with rayfl up"
            )
        from actors.driver.cluster import connect
        from actors.driver.pool import pool_command

        connect(args.address, dashboard=False)
        print(pool_command(args.action))
    return 0


COMMANDS = {
    "run": cmd_run,
    "submit": cmd_submit,
    "fetch": cmd_fetch,
    "tune": cmd_tune,
    "list": cmd_list,
    "compare": cmd_compare,
    "timeline": cmd_timeline,
    "traces": cmd_traces,
    "up": cmd_cluster,
    "down": cmd_cluster,
    "pool": cmd_cluster,
}
"""What each command of the grammar (`rayfl.arguments`) runs."""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log = logging.getLogger("rayfl")  # rayfl's notices (a checkpoint passed over, actors pending): one line each
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("rayfl: %(message)s"))
    log.handlers = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        with logging_redirect_tqdm(loggers=[log]):  # a notice on a line of its own, below a round bar
            return COMMANDS[args.command](args)
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

"""The command line's grammar: every command of `rayfl`, its arguments and their help (argparse).
What each command runs is `rayfl.cli`; this module imports nothing heavier than argparse, so a
usage error is found before anything else loads."""

from __future__ import annotations

import argparse
from typing import Any


class Parser(argparse.ArgumentParser):
    """Whole option names only (an abbreviation such as ``--config`` must not silently mean the hidden
    ``--config-env``), and a usage error is one line, exit 2, like every other bad input."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:
        self.exit(2, f"rayfl: error: {message}\n")


DASHBOARD_HELP = (
    "the cluster's dashboard, http://HOST:8265; default: $RAY_API_SERVER_ADDRESS (as Ray's job CLI reads it), else "
    "the head rayfl up keeps"
)


def add_jobs(sub: argparse._SubParsersAction) -> None:
    """`rayfl submit` and `rayfl fetch` (rayfl/api.py)."""
    submit = sub.add_parser("submit", help="submit a run to a Ray cluster as a job")
    submit.add_argument("config", nargs="?", help="config YAML")
    submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    submit.add_argument("--address", help=DASHBOARD_HELP)
    submit.add_argument(
        "--out", help="RUN_DIR: a folder on the head or a URI (s3://, gs://; default ~/rayfl/runs/<job id> on the head)"
    )
    submit.add_argument(
        "--wait", action="store_true", help="follow the job (a bar of rounds) and return its exit status"
    )
    submit.add_argument("--fetch", action="store_true", help="with --wait: then copy the RUN_DIR here (as rayfl fetch)")
    submit.add_argument("--to", metavar="DIR", help="with --fetch: where to (default ./runs/<job id>)")
    submit.add_argument(
        "--verbose", action="store_true", help="Ray's log lines; with --wait, every log line of the job"
    )

    fetch = sub.add_parser("fetch", help="copy a submitted run's RUN_DIR to this machine")
    fetch.add_argument("job", metavar="JOB_ID")
    fetch.add_argument("--address", help=DASHBOARD_HELP)
    fetch.add_argument("--to", metavar="DIR", help="where to (default ./runs/<RUN_DIR name>)")
    fetch.add_argument(
        "--client-port",
        type=int,
        default=10001,
        help="the head's Ray Client port, for a RUN_DIR only the cluster reads (default 10001)",
    )


def add_cluster(sub: argparse._SubParsersAction) -> None:
    """`rayfl up`, `rayfl down` and `rayfl pool status | drain` (docs/ray.md, "Warm clusters")."""
    up = sub.add_parser("up", help="start a local Ray head kept between runs (their actors stay warm)")
    up.add_argument("--num-cpus", type=int, help="CPUs it offers (default: this machine's)")
    up.add_argument("--num-gpus", type=int, help="GPUs it offers (default: those Ray finds)")
    up.add_argument("--dashboard", action="store_true", help="with the dashboard on 127.0.0.1 (a free port)")
    up.add_argument(
        "--dashboard-port",
        type=int,
        metavar="PORT",
        help="with the dashboard on 127.0.0.1:PORT (another free one if it is taken)",
    )
    up.add_argument(
        "--node-ip-address",
        metavar="ADDRESS",
        help="open Ray's ports to the network, with this address of the host for the head (other nodes join it "
        "there, with its token); default: they listen on 127.0.0.1 only",
    )
    up.add_argument(
        "--env",
        action="store_true",
        help='with the dashboard; print only the line that points Ray\'s job CLI at it (eval "$(rayfl up --env)"): '
        "RAY_AUTH_MODE=token and RAY_API_SERVER_ADDRESS",
    )
    sub.add_parser("down", help="stop the local head rayfl up started")
    pool = sub.add_parser("pool", help="the cluster's warm actors: status, or drain the idle ones")
    pool.add_argument("action", choices=["status", "drain"])
    pool.add_argument(
        "--address",
        help="the cluster: its GCS (HOST:PORT) or its dashboard (http://HOST:8265); default: $RAY_ADDRESS, else the "
        "head rayfl up keeps",
    )


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


def add_run(sub: argparse._SubParsersAction) -> None:
    """`rayfl run`."""
    run = sub.add_parser(
        "run",
        help="run one federation (the embedded default without CONFIG)",
        description="Run one federation: CONFIG (YAML) or the embedded default, with --set overrides.",
        epilog="examples:\n"
        "  rayfl run --set algorithm.name=heterofl --set federation.rounds=10 --out runs/heterofl\n"
        "  rayfl run examples/heterofl/a-e.yaml --local\n\n"
        "every key, its default and its range: docs/config.md (rayfl list names the algorithms, datasets, "
        "models and device profiles)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("config", nargs="?", help="config YAML")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    run.add_argument(
        "--out",
        help="RUN_DIR: a folder or a URI (s3://, gs://, file://; default runs/<time>-<algorithm>-<dataset>, in a Ray "
        "job ~/rayfl/runs/<job id>)",
    )
    run.add_argument(
        "--resume", metavar="RUN_DIR", help="continue RUN_DIR from its newest checkpoint (--set may extend rounds)"
    )
    run.add_argument("--overwrite", action="store_true", help="with --out: replace the run that folder holds")
    run.add_argument(
        "--address",
        help="join this Ray cluster (default: $RAY_ADDRESS, else the head rayfl up keeps, else start a local one)",
    )
    run.add_argument("--local", action="store_true", help="run in this process without Ray (the reference runner)")
    run.add_argument("--config-env", help=argparse.SUPPRESS)
    run.add_argument("--progress", choices=["bar", "lines"], default="bar", help=argparse.SUPPRESS)


def add_tune(sub: argparse._SubParsersAction) -> None:
    """`rayfl tune` (docs/tune-guide.md)."""
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


def add_reading(sub: argparse._SubParsersAction) -> None:
    """`rayfl list`, `rayfl compare` and `rayfl timeline`: what reads the catalog and finished runs."""
    sub.add_parser("list", help="algorithms, datasets, models and device profiles")

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

    timeline = sub.add_parser(
        "timeline", help="a run's virtual clock as a Gantt chart (and the staleness of an async run's updates)"
    )
    timeline.add_argument("run_dir", metavar="RUN_DIR")
    timeline.add_argument("--rounds", metavar="A-B", help="only these rounds (server steps), e.g. 1-5 (default: all)")
    timeline.add_argument("--out", metavar="FILE", help="the PNG to write (default: RUN_DIR/timeline.png)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="rayfl", description="Federated learning over heterogeneous devices on Ray")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_run, add_jobs, add_tune, add_reading, add_traces, add_cluster):
        add(sub)
    return parser

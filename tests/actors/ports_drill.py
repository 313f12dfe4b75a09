"""The ports a run's own local cluster listens on: `python -m tests.actors.ports_drill RUN_DIR`.

A `rayfl run` of 3 rounds (the mlp, 2 client actors, the dashboard on) that starts its own
cluster and waits for its actors. At the first round the coordinator reports, it waits (at most
2 minutes: Ray starts its agents in the background) until the metrics export answers `GET
/metrics` on 127.0.0.1 and the client actors' sockets are listed (`psutil.net_connections`
missed both actors' once, on a busy machine), then prints one JSON object (`last`: the last
listing, whether or not it got that far): `sockets`, every listening TCP socket of its
process tree (GCS, raylet, agents, dashboard, metrics export, the actors' workers) as `[ip, port,
process name]`; `network`, this host's IPv4 addresses other than the loopback; `reached`, those
of them on which the metrics export's port took a connection. `tests/actors/test_ports.py` runs
it with a HOME and Ray temp folder of its own.
"""

import http.client
import ipaddress
import json
import os
import socket
import sys
import time
import urllib.request

import psutil

from rayfl import api
from rayfl.load import load_config

SETS = ["federation.rounds=3", "model.name=mlp", "ray.num_actors=2", "ray.start_in_process=false"]


def listening(root: int) -> list[tuple[str, int, str]]:
    """Every listening TCP socket of process `root` and its descendants: (ip, port, process name)."""
    tree = {root, *(p.pid for p in psutil.Process(root).children(recursive=True))}
    names = {}
    for pid in tree:
        try:
            names[pid] = psutil.Process(pid).name()
        except psutil.NoSuchProcess:
            pass
    return [
        (c.laddr.ip, c.laddr.port, names.get(c.pid, "?"))
        for c in psutil.net_connections("inet")
        if c.status == psutil.CONN_LISTEN and c.pid in tree
    ]


def loopback(ip: str) -> bool:
    """Whether `ip` is a loopback address (an IPv4 one mapped into IPv6 too, as Ray's gRPC shows it)."""
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def metrics_export(sockets: list[tuple[str, int, str]]) -> int | None:
    """The port among the dashboard agent's on which `GET /metrics` answers 200 on 127.0.0.1; None: none yet."""
    for _, port, name in sockets:
        if name == "ray::DashboardAgent":
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
                    if answer.status == 200:
                        return port
            except (OSError, http.client.HTTPException):  # another of its ports (gRPC answers no HTTP), or not up yet
                continue
    return None


def takes(address: str, port: int) -> bool:
    """Whether `address:port` takes a TCP connection."""
    try:
        socket.create_connection((address, port), timeout=5).close()
        return True
    except OSError:
        return False


def main(run_dir: str) -> int:
    seen = {}

    def progress(row):
        deadline = time.monotonic() + 120
        while "sockets" not in seen and time.monotonic() < deadline:
            sockets = listening(os.getpid())  # a listing may miss a process whose files change under it: again
            seen["last"] = sockets
            port = metrics_export(sockets)
            if port is not None and any(name.startswith("ray::ClientActor") for _, _, name in sockets):
                network = [
                    a.address for nic in psutil.net_if_addrs().values() for a in nic if a.family == socket.AF_INET
                ]
                network = [a for a in network if not loopback(a)]
                seen.update(sockets=sockets, network=network, reached=[a for a in network if takes(a, port)])
            time.sleep(0.5)

    api.run(load_config(None, SETS), run_dir, progress=progress)
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""The core never imports ray; the import graph has no cycle and no upward import; actors/ is cut by process."""

import ast
import graphlib
import subprocess
import sys
from pathlib import Path


def test_core_modules_leave_ray_unimported():
    code = (
        "import sys; import rayfl.data, rayfl.models, rayfl.algorithms, rayfl.devices, rayfl.metrics, "
        "rayfl.engine, rayfl.runner, rayfl.config, rayfl.compare, rayfl.cli; print(sorted(m for m in sys.modules if "
        "m == 'ray' or m.startswith('ray.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_module_imports_first_without_a_cycle():
    # Each module imported first, in a process where no other project module is loaded yet; the
    # modules split between two processes that run side by side.
    import pkgutil

    import actors
    import rayfl
    import tune

    names = sorted(
        m.name
        for pkg in (rayfl, actors, tune)
        for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
        if not m.name.endswith("__main__")
    )
    assert len(names) > 30
    code = """
import importlib, sys
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split('.')[0] in ('rayfl', 'actors', 'tune')]:
        del sys.modules[loaded]
    importlib.import_module(name)
"""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *names[k::2]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for k in (0, 1)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]


# --------------------------------------------------------------------------- the import graph

ROOT = Path(__file__).resolve().parent.parent

LAYERS = [
    # bottom first: a module may import its own layer and the ones below, never one above
    [
        "rayfl.types",
        "rayfl.statetypes",
        "rayfl.rng",
        "rayfl.catalog",
        "rayfl.catalog_builtin",
        "rayfl.storage",
        "rayfl.config",
    ],
    ["rayfl.optim", "rayfl.devices", "rayfl.data", "rayfl.models"],
    ["rayfl.evaluate", "rayfl.metrics", "rayfl.compare", "rayfl.timeline"],
    # the algorithm kit: the contract's two leaves, and the pure pieces every algorithm shares
    [
        "rayfl.algorithms.messages",
        "rayfl.algorithms.local",
        "rayfl.algorithms.aggregate",
        "rayfl.algorithms.server_opt",
        "rayfl.algorithms.exchange",
        "rayfl.algorithms.personal",
        "rayfl.algorithms.vectorize",
        "rayfl.algorithms.budget",
    ],
    ["rayfl.algorithms.base", "rayfl.algorithms.capabilities", "rayfl.algorithms.registry"],
    ["rayfl.algorithms"],  # each algorithm's module, and the package that registers them
    ["rayfl.checkpoint", "rayfl.resume", "rayfl.load"],
    ["rayfl.engine"],
    ["rayfl.runner"],
    ["rayfl.api", "rayfl.cli", "rayfl.arguments", "rayfl.console", "rayfl.__main__", "rayfl"],
]


def modules(package: str, root: Path = ROOT) -> dict[str, Path]:
    base = root / package
    out = {}
    for path in base.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its file (at the top, in a function,
    under TYPE_CHECKING alike), with the packages whose `__init__` such an import runs."""
    mods = modules(package, root)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        here = name if is_pkg else name.rsplit(".", 1)[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names}
        edges = set()
        for t in targets:
            if t.split(".")[0] != package:
                continue
            edges.add(t)
            parts = t.split(".")
            for k in range(1, len(parts)):  # a package's __init__ runs first, unless it is the importer's own
                ancestor = ".".join(parts[:k])
                if not (name == ancestor or name.startswith(ancestor + ".")):
                    edges.add(ancestor)
        graph[name] = edges - {name}
    return graph


def layer(module: str) -> int:
    best = max((p for names in LAYERS for p in names if module == p or module.startswith(p + ".")), key=len)
    return next(i for i, names in enumerate(LAYERS) if best in names)


def test_the_core_has_no_import_cycle():
    graph = import_graph("rayfl")
    assert len(graph) > 60
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_no_module_of_the_core_imports_upward():
    upward = [f"{m} -> {t}" for m, targets in import_graph("rayfl").items() for t in targets if layer(t) > layer(m)]
    assert upward == []


def test_the_contract_leaves_import_no_other_algorithm_module():
    graph = import_graph("rayfl")
    algorithms = lambda m: {t for t in graph[m] if t.startswith("rayfl.algorithms")}
    assert algorithms("rayfl.algorithms.messages") == set()
    assert algorithms("rayfl.algorithms.local") == {"rayfl.algorithms.messages"}


def test_the_ray_hosts_never_lean_on_the_in_process_runner():
    # the hosts (coordinator, client actors); the driver begins a run in process while they come
    # up (`ray.start_in_process`, actors/driver/launch.py)
    hosts = [ROOT / "actors" / "client.py", *(ROOT / "actors" / "coordinator").rglob("*.py")]
    assert len(hosts) >= 4
    for path in hosts:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == "rayfl.runner" or n.startswith("rayfl.runner.") for n in names), path


def test_the_graph_sees_a_cycle_and_an_upward_import(tmp_path):
    # the checks above can fail: a two-module package importing each other, lazily, is a cycle
    pkg = tmp_path / "loop"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n")
    graph = import_graph("loop", tmp_path)
    assert graph["loop.a"] == {"loop.b"} and graph["loop.b"] == {"loop.a"}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
        raise AssertionError("no cycle found")
    except graphlib.CycleError:
        pass
    assert (
        layer("rayfl.engine.round")
        > layer("rayfl.algorithms.fedavg")
        > layer("rayfl.algorithms.base")
        > layer("rayfl.algorithms.messages")
    )


# --------------------------------------------------------------------------- actors/, by process
PROCESSES = {
    "actors.names": "any",  # leaves every process may import
    "actors.raystate": "any",
    "actors.client": "client actor",
    "actors.keeper": "pool keeper",
    "actors.coordinator": "coordinator",
    "actors.driver": "driver",
}
"""Where each module of `actors/` runs (by its longest prefix)."""
STARTS = {"driver": {"client actor", "pool keeper", "coordinator"}}
"""A process may import another's modules only to start its actors: the driver starts them all."""


def process(module: str) -> str:
    return PROCESSES[max((p for p in PROCESSES if module == p or module.startswith(p + ".")), key=len)]


def test_actors_are_cut_by_the_process_they_run_in():
    graph = import_graph("actors")
    assert {process(m) for m in graph if m != "actors"} == {
        "any",
        "client actor",
        "pool keeper",
        "coordinator",
        "driver",
    }
    crossing = [
        f"{m} ({process(m)}) -> {t} ({process(t)})"
        for m, targets in graph.items()
        if m != "actors"
        for t in targets
        if t != "actors" and process(t) not in ("any", process(m)) and process(t) not in STARTS.get(process(m), ())
    ]
    assert crossing == []
    leaves = [f"{m} -> {t}" for m, ts in graph.items() if m in PROCESSES and process(m) == "any" for t in ts]
    assert leaves == []
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_rays_private_api_is_read_in_one_module():
    readers = sorted(
        str(path.relative_to(ROOT))
        for package in ("rayfl", "actors", "tune")
        for path in (ROOT / package).rglob("*.py")
        if "ray._private" in path.read_text() or "ray._raylet" in path.read_text()
    )
    assert readers == ["actors/raystate.py"]

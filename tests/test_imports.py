"""The core never imports ray."""

import subprocess
import sys


def test_core_modules_leave_ray_unimported():
    code = (
        "import sys; import rayfl.data, rayfl.models, rayfl.algorithms, rayfl.devices, rayfl.metrics, "
        "rayfl.engine, rayfl.runner, rayfl.config, rayfl.compare, rayfl.cli; print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
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

    names = sorted(m.name for pkg in (rayfl, actors, tune) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".") if not m.name.endswith("__main__"))
    assert len(names) > 30
    code = """
import importlib, sys
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split('.')[0] in ('rayfl', 'actors', 'tune')]:
        del sys.modules[loaded]
    importlib.import_module(name)
"""
    procs = [subprocess.Popen([sys.executable, "-c", code, *names[k::2]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in (0, 1)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]

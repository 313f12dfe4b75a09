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
    code = """
import importlib, pkgutil, sys
import rayfl, actors, tune
names = sorted(m.name for pkg in (rayfl, actors, tune) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.') if not m.name.endswith('__main__'))
for name in names:
    for loaded in [m for m in sys.modules if m.split('.')[0] in ('rayfl', 'actors', 'tune')]:
        del sys.modules[loaded]
    importlib.import_module(name)
print(len(names))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) > 30

"""The core never imports ray."""

import subprocess
import sys


def test_core_modules_leave_ray_unimported():
    code = (
        "import sys; import rayfl.data, rayfl.models, rayfl.algorithms, rayfl.devices, rayfl.metrics, "
        "rayfl.engine, rayfl.runner, rayfl.config, rayfl.cli; print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""The slowest input a run accepts: YAML files at the limits (`rayfl.config.MAX_YAML_BYTES`,
`MAX_YAML_NODES`), each timed from its bytes to a validated config (`rayfl.load.load_config`,
and for a device profile `rayfl.devices.profile.load_profile` too: parsing, then the whole
schema). Every accepted file must take under 2 s on the 2-core machine; the files just past a
limit are refused at once.

    python bench/yaml_limits.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rayfl.config import MAX_YAML_BYTES, MAX_YAML_NODES, ConfigError
from rayfl.devices.profile import load_profile
from rayfl.load import load_config


def profile(classes: int) -> str:
    """A device profile of `classes` classes (8 values each, 4 power modes)."""
    rows = "".join(
        f"  - {{name: c{k}, proportion: 1, flops: [4.0e+10, 2.0e+10, 1.0e+10, 5.0e+9], memory_mb: 8192, "
        f"bandwidth_mbps: [1, 30]}}\n"
        for k in range(classes)
    )
    return f"name: big\nclasses:\n{rows}"


def milestones(count: int) -> str:
    """A config whose lr schedule lists `count` milestones."""
    steps = ", ".join(f"{(k + 1) / (count + 1):.6f}" for k in range(count))
    return f"federation:\n  lr_schedule: {{kind: multistep, milestones: [{steps}]}}\n"


def timed(text: str, as_profile: bool) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "file.yaml"
        path.write_text(text)
        started = time.perf_counter()
        try:
            if as_profile:
                load_profile(load_config(None, [f"devices.profile={path}"]).devices.profile)
            else:
                load_config(path)
            outcome = "accepted"
        except ConfigError as exc:
            outcome = f"refused: {str(exc).removeprefix(str(path) + ': ')[:70]}"
        return time.perf_counter() - started, outcome


def main() -> None:
    per_class, header = 17, 5  # YAML values: a class's mapping, 5 keys, 9 names and numbers, 2 lists; the file's 5
    at_limit = (MAX_YAML_NODES - header) // per_class
    cases = {
        "profile at MAX_YAML_NODES": (profile(at_limit), True),
        "profile just past MAX_YAML_NODES": (profile(at_limit + 1), True),
        "milestones at MAX_YAML_NODES": (milestones(MAX_YAML_NODES - 9), False),
        "a string at MAX_YAML_BYTES": ("ray:\n  coordinator_node: " + "y" * (MAX_YAML_BYTES - 40) + "\n", False),
        "just past MAX_YAML_BYTES": ("x: " + "y" * MAX_YAML_BYTES + "\n", False),
    }
    print(f"{'file':36} {'KB':>6} {'seconds':>8}  outcome")
    for name, (text, as_profile) in cases.items():
        seconds, outcome = timed(text, as_profile)
        print(f"{name:36} {len(text) // 1024:6d} {seconds:8.2f}  {outcome}")


if __name__ == "__main__":
    main()

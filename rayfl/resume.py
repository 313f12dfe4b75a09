"""What a resumed run may change of the run it continues (`RESUMABLE`), and the keys it changes
beyond that (`computation_changes`): the check `rayfl run --resume` makes before the registries
load (`rayfl/cli.py`), and a checkpoint's against the run being resumed (`rayfl/checkpoint.py`,
`rayfl/engine/loop.py:check_resume`)."""

from __future__ import annotations

from typing import Any, Mapping

RESUMABLE = ("federation.rounds", "federation.checkpoint_every", "federation.target_accuracy", "ray", "metrics")
"""What `--resume` may change (docs/cli.md): more rounds, when to checkpoint, the summary's target,
and how and where the run executes. Any other key would change the computation of the rounds
still to run, so a resumed run would not equal the uninterrupted one: it is refused."""


def _flat(raw: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        return {prefix: raw}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def computation_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """The keys (dotted; `algorithm.name` first, the rest sorted) whose values differ between two
    configs outside `RESUMABLE`, with the value in each (None where a config lacks the key)."""
    old, new = _flat(before), _flat(after)
    kept = lambda key: not any(key == k or key.startswith(f"{k}.") for k in RESUMABLE)
    return [
        (k, old.get(k), new.get(k))
        for k in sorted(old.keys() | new.keys(), key=lambda k: (k != "algorithm.name", k))
        if kept(k) and old.get(k) != new.get(k)
    ]

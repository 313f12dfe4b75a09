"""What crosses between the host and the device while clients train, counted on any machine.

On a GPU the host waits whenever it reads a value back (a scalar, a loss, the weights) and pays a
copy whenever host memory enters the device; a loop that does either every step leaves the chip
idle (docs/design.md, "On a GPU: the worker, not the client, is the unit"). A CPU shows the same
events, so they are counted here with a `TorchDispatchMode`, exactly, whatever the device:

- `scalar_reads`: a value read back to Python (`item()`, `float(t)`, `bool(t)`: aten's
  `_local_scalar_dense`);
- `to_device`: host data entering torch (`torch.tensor`, `torch.from_numpy`, indexing with a
  numpy array: aten's `lift_fresh`, each a copy to the device on a GPU) or a copy from the CPU to
  another device;
- `to_host`: a copy from another device to the CPU, or a CPU tensor's `numpy()` / `tolist()`;
- `load_state_dict`: `nn.Module.load_state_dict` calls (one blocking copy per tensor on a GPU);
- `optimizer_builds`: torch optimizers constructed.

Counts are kept per region (`region`): the tests name the inside of a local step "step".
`bench/client_cost.py` and tests/test_crossings.py use it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
KINDS = ("scalar_reads", "to_device", "to_host", "load_state_dict", "optimizer_builds")


class Crossings(TorchDispatchMode):
    """Counts host-device crossings while active (`with Crossings() as c:`), by region:
    `c.counts[region][kind]`, kinds `KINDS`; the region is "call" unless `region` says otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, Counter] = {}
        self.where = "call"
        self._patches: contextlib.ExitStack | None = None

    def add(self, kind: str, n: int = 1) -> None:
        self.counts.setdefault(self.where, Counter())[kind] += n

    def total(self, kind: str) -> int:
        """`kind`'s count over every region."""
        return sum(c[kind] for c in self.counts.values())

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        """Count what happens inside the block under `name`."""
        before, self.where = self.where, name
        try:
            yield
        finally:
            self.where = before

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            self.add("scalar_reads")
        elif func is aten.lift_fresh.default:
            self.add("to_device")
        elif func in (aten._to_copy.default, aten.copy_.default):
            src = args[0] if func is aten._to_copy.default else args[1]
            dst = kwargs.get("device") if func is aten._to_copy.default else args[0].device
            if isinstance(src, torch.Tensor) and dst is not None:
                dst = torch.device(dst)
                if src.device.type == "cpu" and dst.type != "cpu":
                    self.add("to_device")
                elif src.device.type != "cpu" and dst.type == "cpu":
                    self.add("to_host")
        return func(*args, **kwargs)

    def __enter__(self) -> "Crossings":
        self._patches = contextlib.ExitStack()
        for owner, name, kind in (
            (torch.Tensor, "numpy", "to_host"),
            (torch.Tensor, "tolist", "to_host"),
            (nn.Module, "load_state_dict", "load_state_dict"),
            (torch.optim.Optimizer, "__init__", "optimizer_builds"),
        ):
            self._patches.enter_context(_counting(self, owner, name, kind))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._patches.close()


@contextlib.contextmanager
def _counting(counter: Crossings, owner: type, name: str, kind: str) -> Iterator[None]:
    """`owner.name` counted under `kind` while the block runs (a CPU tensor's `numpy` and `tolist`
    only: another device's go through a copy to the CPU first, counted by the mode)."""
    original = getattr(owner, name)

    def counted(self, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(self, torch.Tensor) or self.device.type == "cpu":
            counter.add(kind)
        return original(self, *args, **kwargs)

    setattr(owner, name, counted)
    try:
        yield
    finally:
        setattr(owner, name, original)

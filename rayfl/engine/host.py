"""What runs where a federation's clients train: the `ClientRunner` both executors host (in this
process, and on each Ray client actor), and the one client-outcome logic.

For each task the runner hands the algorithm's procedure the client's data (`ClientData`) and
a `ClientContext`, runs it with torch's RNG keyed by (seed, round, client) (or `ray.vectorize`
clients of one model variant in one batched call), and turns a client with no samples, a
non-finite loss or any error into a `ClientFailure`. `run_group` settles each outcome where it
ran (`settle`: status, reason, cost on the virtual clock, by the federation's `ClientAccount`)
and, where the scheduler says the call sums, adds the accepted clients' summands into the
group's partial sum.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from .. import rng
from ..algorithms.aggregate import accumulate, invalid_reason
from ..algorithms.base import ClientProcedure
from ..algorithms.capabilities import ClientAccount
from ..algorithms.exchange import ClientSession
from ..algorithms.local import ClientContext, ClientData, ClientDiverged
from ..algorithms.messages import ClientFailure, ClientResult, ClientTask
from ..data import Clients
from ..models import ModelCache
from ..types import ClientId
from .federation import Federation

TORCH_THREADS = 1
"""Client training and evaluation run with a fixed torch thread count, so results do not
depend on the host (in-process, one actor or many give bit-identical metrics)."""

NO_SAMPLES = "no training samples"


@contextlib.contextmanager
def torch_threads(n: int = TORCH_THREADS) -> Iterator[None]:
    """Pin torch's intra-op threads for the block (results then match across hosts)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def keep_freed_memory() -> None:
    """Have glibc's allocator keep freed memory for reuse (the mmap threshold raised to 32 MB, the
    most every glibc takes; the trim threshold to 256 MB) instead of handing it back to the
    kernel and faulting it in again. Process-wide and for good: the process's resident memory
    then stays near its peak. Vectorized clients on a CPU allocate megabytes of stacked
    gradients every step; with glibc's defaults a round of 10 MLP clients took about 1,500 page
    faults and a third longer (`bench/vectorize.py` prints the faults). Set when a runner is
    built to train vectorized on the CPU; Linux only (elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:  # not glibc
        return
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD


VECTORIZE_HEADROOM = 0.8
"""Of a GPU actor's memory share, what `ray.vectorize: auto` fills with clients' training memory
(the rest: the CUDA context, the allocator's fragmentation)."""


def vectorize_width(fed: Federation, device: str, memory_share: float | None) -> int:
    """Clients trained together: `ray.vectorize`, or under `auto`, on a CUDA device where the
    algorithm and model allow it, a call's clients (`RunConfig.call_size`) as far as
    `VECTORIZE_HEADROOM` of the memory share holds the model's training memory for each; else 1."""
    width = fed.config.ray.vectorize
    if width != "auto":
        return width
    if device != "cuda" or not fed.vectorizable or memory_share is None:
        return 1
    each = fed.context.training_memory(fed.config.model)
    return max(1, min(fed.config.call_size, int(VECTORIZE_HEADROOM * memory_share // each)))


class ClientRunner:
    """Runs client tasks of one federation against the training arrays it holds."""

    def __init__(
        self, procedure: ClientProcedure, clients: Clients, seed: int, device: str = "cpu", vectorize: int = 1
    ):
        self.procedure = procedure
        self.clients = clients
        self.seed = seed
        self.vectorize = vectorize
        if vectorize > 1 and device == "cpu":
            keep_freed_memory()
        self.context = ClientContext(seed, ModelCache(clients.input_shape, clients.num_classes, device))

    @classmethod
    def of(cls, fed: Federation, device: str = "cpu", memory_share: float | None = None) -> "ClientRunner":
        """The runner of a federation on `device`; `memory_share`: the bytes of GPU memory its
        process may use (for `ray.vectorize: auto`)."""
        return cls(fed.procedure, fed.clients, fed.config.seed, device, vectorize_width(fed, device, memory_share))

    def data(self, client: int) -> ClientData:
        """The client's samples, produced now (a logical client costs nothing until its task runs)."""
        x, y = self.clients.train(client)
        device = self.context.device
        return ClientData(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))

    def run_all(self, tasks: Sequence[ClientTask]) -> list[ClientResult | ClientFailure]:
        """The tasks of a group, in the order given: one after another, or `vectorize` at a time
        in one batched call (`ray.vectorize`: the procedure's `run_vectorized`) over tasks of one
        model variant (a group may mix variants, InclusiveFL's depths)."""
        if self.vectorize <= 1:
            chunks = [[t] for t in tasks]
        else:
            variants: dict = {}
            for t in tasks:
                variants.setdefault(t.model, []).append(t)
            chunks = [
                same[i : i + self.vectorize] for same in variants.values() for i in range(0, len(same), self.vectorize)
            ]
        out: dict[ClientId, ClientResult | ClientFailure] = {}
        for chunk in chunks:
            out.update((o.client_id, o) for o in self.outcomes(chunk))
        return [out[t.client_id] for t in tasks]

    def outcomes(self, tasks: Sequence[ClientTask]) -> list[ClientResult | ClientFailure]:
        """The one client-outcome logic of every runner: a client with no samples is skipped; a
        non-finite loss or any error in training ends the task as a `ClientFailure` naming it,
        with the samples it had processed (a batched call that raises fails all its clients)."""
        datas = {t.client_id: self.data(t.client_id) for t in tasks}
        skipped = [ClientFailure.of(t, NO_SAMPLES, skipped=True) for t in tasks if not len(datas[t.client_id])]
        live = [t for t in tasks if len(datas[t.client_id])]
        if not live:
            return skipped
        self.context.samples_drawn = 0
        try:
            if self.vectorize > 1:
                return skipped + self.procedure.run_vectorized(live, [datas[t.client_id] for t in live], self.context)
            (task,) = live
            with rng.seeded_torch(self.seed, "client-train", task.round, task.client_id):
                return [self.procedure.run(task, datas[task.client_id], self.context)]
        except Exception as exc:  # a client's failure is data, never the run's end
            reason = str(exc) if isinstance(exc, ClientDiverged) else f"{type(exc).__name__}: {exc}"
            spent = self.context.samples_drawn if self.vectorize <= 1 else 0  # a batched call's failure: none counted
            return skipped + [ClientFailure.of(t, reason, num_samples=spent) for t in live]

    def open_session(self, task: ClientTask) -> ClientSession:
        """The procedure's session for a server-in-the-loop round (each owns its modules, so one
        host may hold several clients' sessions at once)."""
        return self.procedure.open_session(task, self.data(task.client_id), self.context)


@dataclass(frozen=True)
class Settled:
    """One client's outcome as the round records it."""

    outcome: ClientResult | ClientFailure
    """The result (its weights dropped once added into a partial sum) or the failure."""
    status: str
    """ok | rejected (an update with non-finite values, wrong keys or shapes) | failed | skipped |
    dropped (`admission`)."""
    reason: str
    cost: tuple[float, int, int] | None
    """(training FLOPs, bytes down, bytes up) on the virtual clock; None for a skipped client."""
    cut_s: float | None = None
    """A dropped client: the seconds it worked before its device went offline (its cost is
    charged up to then, `devices.spent`)."""


@dataclass(frozen=True)
class GroupOutcome:
    """A group of clients run together: each one's record, and the partial sum of the accepted
    clients' summands (policies whose aggregate is a sum; empty otherwise or when none was accepted)."""

    settled: list[Settled]
    total: dict[str, np.ndarray]


def settle(account: ClientAccount, task: ClientTask, out: ClientResult | ClientFailure) -> Settled:
    """The one client-outcome record: a skipped client costs nothing; a failed one its download
    and the samples it processed; an update is checked against its task (`invalid_reason`) and
    costed by the federation's `ClientAccount`."""
    if isinstance(out, ClientFailure):
        if out.skipped:
            return Settled(out, "skipped", out.reason, None)
        spent = ClientResult.of(task, weights={}, num_examples=0, num_samples=out.num_samples, train_loss=float("nan"))
        return Settled(out, "failed", out.reason, account.cost(task, spent))
    reason = invalid_reason(out.weights, task.weights)
    return Settled(out, "rejected" if reason else "ok", reason or "", account.cost(task, out))


def settle_all(
    account: ClientAccount, tasks: Sequence[ClientTask], outcomes: Sequence[ClientResult | ClientFailure], sums: bool
) -> GroupOutcome:
    """Settle each task's outcome; with `sums` (the scheduler's say, for a policy that `Sums`), add
    the accepted clients' summands in task order and drop their weights (no summand is held)."""
    settled, total = [], {}
    for task, out in zip(tasks, outcomes):
        record = settle(account, task, out)
        if sums and record.status == "ok":
            total = accumulate(total, account.summand(out))
            record = Settled(out.replace(weights={}), record.status, record.reason, record.cost)
        settled.append(record)
    return GroupOutcome(settled, total)


def run_group(runner: ClientRunner, account: ClientAccount, tasks: Sequence[ClientTask], sums: bool) -> GroupOutcome:
    """Run a group's tasks (one after another, or vectorized) and settle them, added up where they
    ran when the scheduler says `sums`: what both executors call, in process and on each actor."""
    return settle_all(account, tasks, runner.run_all(tasks), sums)


def failed_all(tasks: Sequence[ClientTask], reason: str) -> list[ClientFailure]:
    """Every task of a call that failed as a whole (an actor that died, an exchange that broke off)."""
    return [ClientFailure.of(t, reason) for t in tasks]


def exchange_failed(tasks: Sequence[ClientTask], reason: str) -> list[ClientFailure]:
    """Every session of a server-in-the-loop round that broke off: no client's update counts."""
    return failed_all(tasks, f"exchange failed: {reason}")

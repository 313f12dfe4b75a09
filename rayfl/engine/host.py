"""What runs where a federation's clients train: the `ClientRunner` both executors host (in this
process, and on each Ray client actor), and the one client-outcome logic.

For each task the runner hands the algorithm's procedure the client's data (`ClientData`, moved
to the device once per host and kept) and its `ClientContext`, with the device's generator
seeded by (seed, round, client) (or `ray.vectorize` clients of one model variant in one batched
call), and turns a client with no samples, a non-finite loss or any error into a
`ClientFailure`. `run_group` settles each outcome as it comes, in task order (`settle`: status,
reason, cost on the virtual clock, by the federation's `ClientAccount`) and, where the scheduler
says the call sums, adds the accepted clients' summands into the call's one sum on the device
(`aggregate.Sum`): a client's weights never leave the device, only the call's sum does
(docs/design.md, "On a GPU"). Other results cross to the host whole.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from .. import rng
from ..algorithms.aggregate import Sum, invalid_reason
from ..algorithms.base import ClientProcedure
from ..algorithms.capabilities import ClientAccount
from ..algorithms.exchange import ClientSession
from ..algorithms.local import ClientContext, ClientData
from ..algorithms.messages import ClientFailure, ClientResult, ClientTask, OnDevice
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


DATA_CACHE_BYTES = 256 << 20
"""The most bytes of clients' samples a runner keeps on its device (the least recently trained
client's leave first), so a host keeps what it trains without its memory growing with the population."""


class ClientRunner:
    """Runs client tasks of one federation against the training arrays it holds."""

    def __init__(
        self,
        procedure: ClientProcedure,
        clients: Clients,
        seed: int,
        device: str = "cpu",
        vectorize: int = 1,
        precision: str = "fp32",
        sum_device: str | None = None,
    ):
        self.procedure = procedure
        self.clients = clients
        self.seed = seed
        self.vectorize = vectorize
        if vectorize > 1 and device == "cpu":
            keep_freed_memory()
        self.context = ClientContext(seed, ModelCache(clients.input_shape, clients.num_classes, device), precision)
        self.sum_device = sum_device or device
        """Where a call's sum is kept: the training device, or the host (`ray.sums: host`)."""
        self._data: OrderedDict[int, ClientData] = OrderedDict()
        self._data_bytes = 0

    @classmethod
    def of(cls, fed: Federation, device: str = "cpu", memory_share: float | None = None) -> "ClientRunner":
        """The runner of a federation on `device`; `memory_share`: the bytes of GPU memory its
        process may use (for `ray.vectorize: auto`)."""
        cfg = fed.config
        return cls(
            fed.procedure,
            fed.clients,
            cfg.seed,
            device,
            vectorize_width(fed, device, memory_share),
            cfg.federation.precision,
            "cpu" if cfg.ray.sums == "host" else None,
        )

    def data(self, client: int) -> ClientData:
        """The client's samples on the device: produced and moved there once (a logical client
        costs nothing until its task runs), then kept while `DATA_CACHE_BYTES` holds them."""
        if client in self._data:
            self._data.move_to_end(client)
            return self._data[client]
        x, y = self.clients.train(client)
        device = self.context.device
        data = ClientData(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
        self._data[client] = data
        self._data_bytes += x.nbytes + y.nbytes
        while self._data_bytes > DATA_CACHE_BYTES and len(self._data) > 1:
            _, old = self._data.popitem(last=False)
            self._data_bytes -= old.x.nbytes + old.y.nbytes
        return data

    def trained(self, tasks: Sequence[ClientTask]) -> Iterator[tuple[ClientTask, ClientResult | ClientFailure]]:
        """The tasks of a call with their outcomes, in the order given: one after another, or
        `vectorize` at a time in one batched call (the procedure's `run_vectorized`) over tasks of
        one model variant (a call may mix variants, InclusiveFL's depths). A result's weights
        may be its host's module's own tensors (`OnDevice`): valid until the next is asked for."""
        self.context.begin_call()
        chunk_of: dict[ClientId, list[ClientTask]] = {}
        if self.vectorize > 1:
            variants: dict = {}
            for t in tasks:
                variants.setdefault(t.model, []).append(t)
            for same in variants.values():
                for i in range(0, len(same), self.vectorize):
                    chunk_of.update((t.client_id, same[i : i + self.vectorize]) for t in same[i : i + self.vectorize])
        done: dict[ClientId, ClientResult | ClientFailure] = {}
        for task in tasks:
            if task.client_id not in done:
                done.update((o.client_id, o) for o in self.outcomes(chunk_of.get(task.client_id, [task])))
            yield task, done.pop(task.client_id)

    def run_all(self, tasks: Sequence[ClientTask]) -> list[ClientResult | ClientFailure]:
        """The outcomes of `tasks` in the order given, their weights on the host."""
        return [on_host(out) for _, out in self.trained(tasks)]

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
            with rng.seeded_device(self.context.device, self.seed, "client-train", task.round, task.client_id):
                return [self.procedure.run(task, datas[task.client_id], self.context)]
        except Exception as exc:  # a client's failure is data, never the run's end
            spent = self.context.samples_drawn if self.vectorize <= 1 else 0  # a batched call's failure: none counted
            return skipped + [ClientFailure.of(t, f"{type(exc).__name__}: {exc}", num_samples=spent) for t in live]

    def open_session(self, task: ClientTask) -> ClientSession:
        """The procedure's session for a server-in-the-loop round (each owns its modules, so one
        host may hold several clients' sessions at once)."""
        return self.procedure.open_session(task, self.data(task.client_id), self.context)

    def sum(self) -> Sum:
        """A call's sum, where `sum_device` says, with this host's scratch buffers."""
        return Sum(self.sum_device, self.context.scratch)


def on_host(out: ClientResult | ClientFailure) -> ClientResult | ClientFailure:
    """An outcome whose weights are on the host (copied off the device when they are not)."""
    if isinstance(out, ClientResult) and isinstance(out.weights, OnDevice):
        return out.replace(weights=out.weights.host())
    return out


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
    account: ClientAccount,
    outcomes: Iterable[tuple[ClientTask, ClientResult | ClientFailure]],
    total: Sum | None = None,
) -> GroupOutcome:
    """Settle each (task, outcome) as it comes; with a `total` (the scheduler's say, for a policy
    that `Sums`), add the accepted clients' summands into it in task order and drop their weights
    (no summand is held). Other accepted results keep their weights, on the host; a rejected
    result's are dropped (nothing reads them)."""
    settled = []
    for task, out in outcomes:
        record = settle(account, task, out)
        if isinstance(out, ClientResult):
            if record.status == "ok" and total is not None:
                total.add(account.summand(out))
                out = out.replace(weights={})
            else:
                out = on_host(out) if record.status == "ok" else out.replace(weights={})
            record = replace(record, outcome=out)
        settled.append(record)
    return GroupOutcome(settled, {} if total is None else total.arrays())


def run_group(runner: ClientRunner, account: ClientAccount, tasks: Sequence[ClientTask], sums: bool) -> GroupOutcome:
    """Run a call's tasks (one after another, or vectorized) and settle each as it comes, added
    up where they ran when the scheduler says `sums`: what both executors call, in process and
    on each actor."""
    return settle_all(account, runner.trained(tasks), runner.sum() if sums else None)


def failed_all(tasks: Sequence[ClientTask], reason: str) -> list[ClientFailure]:
    """Every task of a call that failed as a whole (an actor that died, an exchange that broke off)."""
    return [ClientFailure.of(t, reason) for t in tasks]


def exchange_failed(tasks: Sequence[ClientTask], reason: str) -> list[ClientFailure]:
    """Every session of a server-in-the-loop round that broke off: no client's update counts."""
    return failed_all(tasks, f"exchange failed: {reason}")

"""The one client loop every procedure trains through, and the host's context it runs in.

A procedure supplies its steps (`base.ClientProcedure`: `init`, `schedule`, `step`, `final`); the
loop (`ClientProcedure.run`, ending in `finish`) owns what touches the device, written once
(docs/design.md, "On a GPU: the worker, not the client, is the unit"):

- weights cross to the device once a call (`ClientContext.on_device`) and are copied into a
  module cached per variant and slot (`ClientContext.load`: `copy_`, no `load_state_dict`);
  optimizers are cached too and cleared per client (`ClientContext.optimizer`);
- a stream's batch plan (seeded by (seed, round, client, purpose)) crosses in one copy and each
  batch is a slice of it, gathered on the device (`ClientContext.batches`);
- a step returns its losses as device tensors; nothing is read back while training;
- after the last step the loop reads everything once: the steps' losses, the max-abs of every
  trained tensor (`OnDevice.nonfinite`) and the procedure's device metrics. A NaN or infinite
  loss fails the client with the samples drawn up to that step, as a loop that stopped there;
- the trained tensors stay on the device (`OnDevice`): the host sums them there or copies them off.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .. import rng
from ..config import ModelConfig
from ..models import ModelCache
from ..models.cache import on_device
from ..optim import OptimizerSpec
from .messages import ClientFailure, ClientResult, ClientTask, OnDevice

NON_FINITE = "non-finite training loss"
"""The reason of a client whose training loss went NaN or infinite."""


def epoch_batches(num_examples: int, batch_size: int, g: np.random.Generator) -> list[np.ndarray]:
    """One epoch's shuffled batches; a trailing batch of a single sample is dropped (batch
    norm cannot train on it) unless it is the client's only sample."""
    order = g.permutation(num_examples)
    out = [order[i : i + batch_size] for i in range(0, num_examples, batch_size)]
    if len(out) > 1 and len(out[-1]) == 1:
        out.pop()
    return out


def epoch_samples(num_examples: int, batch_size: int) -> int:
    """The samples in one epoch of `epoch_batches`: all but a dropped trailing single sample."""
    dropped = num_examples > batch_size and (num_examples - 1) % batch_size == 0
    return num_examples - dropped


def batch_plan(
    seed: int,
    task: ClientTask,
    num_examples: int,
    epochs: int | None = None,
    batch_size: int | None = None,
    purpose: str = "batches",
) -> list[np.ndarray]:
    """The index batches of `epochs` (default the task's) shuffled epochs of a client's samples,
    drawn from the generator keyed by (seed, round, client, purpose)."""
    g = rng.generator(seed, purpose, task.round, task.client_id)
    size = batch_size or task.batch_size
    return [
        b for _ in range(task.local_epochs if epochs is None else epochs) for b in epoch_batches(num_examples, size, g)
    ]


@dataclass(frozen=True)
class Batch:
    """A batch's inputs and labels, on the device, and where they sit in the client's samples;
    `size` its samples (known on the host)."""

    x: torch.Tensor
    y: torch.Tensor
    index: torch.Tensor | None = None

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter((self.x, self.y))

    @property
    def size(self) -> int:
        return self.y.shape[0]


@dataclass(frozen=True)
class Tagged:
    """A batch with what its step needs beside it (FeDepth's stage, FedSup's iteration number)."""

    tag: Any
    batch: Batch

    @property
    def size(self) -> int:
        return self.batch.size


@dataclass(frozen=True)
class ClientData:
    """One client's training samples, on the device the task runs on."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.y.shape[0]

    def batch(self, index: torch.Tensor) -> Batch:
        """The samples at `index` (a tensor on the same device), gathered there."""
        return Batch(self.x.index_select(0, index), self.y.index_select(0, index), index)


@dataclass
class LocalState:
    """A client's state during local training (mutable, local to one task)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    extras: Any = None


class Losses:
    """A client's step values as read back once: per step its named values (host floats) and the
    samples its loss is averaged over."""

    def __init__(self, steps: Sequence[tuple[Mapping[str, float], int]]):
        self.steps = steps

    def mean(self, name: str = "loss", each: Callable[[float], float] | None = None) -> float:
        """sum_s value_s n_s / sum_s n_s over the steps that recorded `name`, summed in step order
        (a value first mapped by `each` when given); 0 with no step."""
        total, samples = 0.0, 0
        for values, n in self.steps:
            if name in values:
                v = values[name]
                total += (each(v) if each is not None else v) * n
                samples += n
        return total / max(samples, 1)


@dataclass(frozen=True)
class Trained:
    """What a procedure's `final` hands the loop: the client's result, its values still where it
    trained. `weights`: the trained tensors (a module's `ClientContext.tensors`, or a selection);
    `metrics`: per-client numbers, each a float, a device scalar (read with the losses) or a
    function of the `Losses`; `keep`: what the server keeps for the client (tensors are copied to
    the host); `train_loss`: a function of the `Losses` (default: the mean of "loss");
    `num_samples`: the samples the client's compute processed (default: the samples drawn)."""

    weights: Mapping[str, torch.Tensor]
    metrics: Mapping[str, Any] = field(default_factory=dict)
    keep: Mapping[str, Any] = field(default_factory=dict)
    train_loss: Callable[[Losses], float] | None = None
    num_samples: int | None = None


def host(value: Any) -> Any:
    """`value` with every tensor in it (in dicts, lists and tuples) a numpy array of its own."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True).numpy()
    if isinstance(value, Mapping):
        return {k: host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host(v) for v in value)
    return value


class ClientContext:
    """What every client a host trains shares: its device, cached modules and optimizers, the
    call's weights on the device, the seeded batch plans and the run's precision."""

    def __init__(self, seed: int, models: ModelCache, precision: str = "fp32"):
        self.seed = seed
        self.models = models
        self.precision = precision
        self.samples_drawn = 0
        """Samples in the batches handed out for the current task (what a failure still cost)."""
        self.layouts: dict[tuple, dict[str, tuple[int, ...]]] = {}
        """Strides of vectorized clients' stacked parameters, by (variant, K, input shape): found
        once on this host (`rayfl.algorithms.vectorize.gradient_strides`)."""
        self.scratch: dict = {}
        """Float64 buffers by shape for the sums of this host's calls (`aggregate.Sum`)."""
        self._call: dict[int, tuple[Any, dict[str, torch.Tensor]]] = {}
        self._checked: set[tuple] = set()
        self._optimizers: dict[tuple, torch.optim.Optimizer] = {}

    @property
    def device(self) -> torch.device:
        return torch.device(self.models.device)

    def begin_call(self) -> None:
        """A new call: the weights of the last one are forgotten."""
        self._call.clear()
        self._checked.clear()

    def on_device(self, *weights: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """`weights` (several dicts: their union) as tensors on the device, crossed once a call per
        weights dict (the round's global weights are one dict shared by its tasks)."""
        key = tuple(id(w) for w in weights)
        if key not in self._call:
            merged: dict[str, torch.Tensor] = {}
            for part in weights:
                merged.update(self.on_device(part) if len(weights) > 1 else on_device(part, self.device))
            self._call[key] = (weights, merged)  # the dicts held: their ids stay theirs for the call
        return self._call[key][1]

    def load(self, variant: ModelConfig, *weights: Mapping[str, Any], slot: str = "model") -> nn.Module:
        """The variant's cached module of `slot` (a procedure holding several models names each),
        its state copied from `weights` (several dicts: their union), crossed once a call."""
        return self.models.load(variant, self.on_device(*weights), slot=slot, checked=self._checked)

    def tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """A cached module's state by name: its own tensors (what `Trained.weights` hands on)."""
        return self.models.tensors(model)

    def optimizer(
        self, spec: OptimizerSpec, params: nn.Module | Sequence[nn.Parameter], slot: str = "model"
    ) -> torch.optim.Optimizer:
        """The task's optimizer over `params` (a module's parameters, or a list), reused across
        clients: built once per (slot, these parameters, the spec's kind and settings), its state
        cleared and its rate set per client (a fresh torch optimizer with the same settings takes
        the same steps)."""
        whole = isinstance(params, nn.Module)
        params = params if whole else list(params)
        which = id(params) if whole else tuple(id(p) for p in params)
        key = (slot, which, spec.kind, spec.momentum, spec.weight_decay, spec.grad_clip)
        opt = self._optimizers.get(key)
        if opt is None:
            opt = self._optimizers[key] = spec.build(params.parameters() if whole else params)
        opt.state.clear()
        for group in opt.param_groups:
            group["lr"] = spec.lr
        return opt

    def batches(
        self,
        task: ClientTask,
        data: ClientData,
        epochs: int | None = None,
        batch_size: int | None = None,
        purpose: str = "batches",
    ) -> Iterator[Batch]:
        """Batches of `epochs` (default the task's) shuffled epochs, drawn from the generator keyed
        by (seed, round, client, purpose): the whole plan crosses to the device in one copy and
        each batch is gathered there. A second pass with its own purpose (a fine-tuning stage,
        say) draws independently of the first."""
        plan = batch_plan(self.seed, task, len(data), epochs, batch_size, purpose)
        if not plan:
            return
        index = torch.from_numpy(np.concatenate(plan)).to(self.device)
        start = 0
        for b in plan:
            self.samples_drawn += len(b)
            yield data.batch(index[start : start + len(b)])
            start += len(b)

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for a client's steps (`federation.precision: bf16`): torch's autocast
        to bfloat16 on the device; the parameters, the optimizer and the sums stay float32 / 64."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)


def finish(
    task: ClientTask,
    data: ClientData,
    trained: Trained,
    steps: Sequence[tuple[Mapping[str, torch.Tensor], int, int]],
    drawn: int,
) -> ClientResult | ClientFailure:
    """The client's outcome from one read of its device values: a failure at the first step with
    a NaN or infinite value (the samples drawn up to it), else the result, its weights still on
    the device with the names of those not finite (`OnDevice`)."""
    floating = [k for k, t in trained.weights.items() if t.is_floating_point()]
    scalars = [m for m in trained.metrics.values() if isinstance(m, torch.Tensor)]
    read = [v for values, _, _ in steps for v in values.values()]
    read += torch._foreach_norm([trained.weights[k] for k in floating], math.inf) if floating else []
    values = read + scalars
    if values:  # one copy to the host; float32 values come back exact as Python floats
        same = all(v.dtype == values[0].dtype for v in values)
        values = torch.stack(values if same else [v.to(torch.float64) for v in values]).tolist()
    at = 0
    record = []
    for named, size, drawn_then in steps:
        row = {}
        for name in named:
            row[name], at = values[at], at + 1
            if not math.isfinite(row[name]):
                return ClientFailure.of(task, NON_FINITE, num_samples=drawn_then)
        record.append((row, size))
    norms, read_metrics = values[at : at + len(floating)], iter(values[at + len(floating) :])
    losses = Losses(record)
    metrics = {
        k: next(read_metrics) if isinstance(m, torch.Tensor) else m(losses) if callable(m) else m
        for k, m in trained.metrics.items()
    }
    return ClientResult.of(
        task,
        weights=OnDevice(trained.weights, [k for k, v in zip(floating, norms) if not math.isfinite(v)]),
        num_examples=len(data),
        num_samples=drawn if trained.num_samples is None else trained.num_samples,
        train_loss=trained.train_loss(losses) if trained.train_loss is not None else losses.mean(),
        metrics=metrics,
        keep=host(trained.keep),
    )

"""The cost model of the virtual clock: FLOPs, bytes, memory and time per client.

compute time = training FLOPs of the client's model variant for its samples / device FLOP/s
communication time = bits down / down bandwidth + bits up / up bandwidth + 2 * latency
energy = FLOPs / 10^9 x J/GFLOP + bytes / 10^6 x J/MB
memory = parameters + gradients + optimizer state + activations for one batch
A synchronous round lasts as long as its slowest selected client; a client waits the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from .profile import DeviceState

_PROBE_BATCH = 2  # batch norm cannot train on one sample; FLOPs are linear in the batch


def _probe(input_shape: tuple[int, ...]) -> torch.Tensor:
    """A fixed probe batch (its own generator: measuring never moves torch's global RNG)."""
    return torch.randn(_PROBE_BATCH, *input_shape, generator=torch.Generator().manual_seed(0))


@dataclass(frozen=True)
class ModelCost:
    """Per-variant figures, measured once and cached."""

    num_params: int
    param_bytes: int
    forward_flops: float
    """Forward FLOPs per sample (2 per multiply-add of a matmul or convolution; `flops_on`)."""
    train_flops: float
    """Forward + backward FLOPs per training sample."""
    activation_bytes: float
    """Bytes of tensors saved for backward, per sample."""

    def training_memory(self, batch_size: int, optimizer_slots: int = 1) -> int:
        """Bytes to train: weights, gradients, `optimizer_slots` state copies, one batch of activations."""
        return math.ceil(self.param_bytes * (2 + optimizer_slots) + self.activation_bytes * batch_size)


def count_flops(model: nn.Module, input_shape: tuple[int, ...], train: bool) -> float:
    """FLOPs per sample of a forward (and, with `train`, backward) pass, counted by torch."""
    return flops_on(model, _probe(input_shape), train)


def flops_on(model: nn.Module, x: torch.Tensor, train: bool) -> float:
    """FLOPs per sample of `model` on the batch `x`: forward, or forward and backward.

    torch's `FlopCounterMode` counts 2 FLOPs per multiply-add of matrix products, convolutions
    and attention; element-wise work (normalisation, activations, pooling) counts nothing, as in
    the FLOP tables of the papers (FedSup's Table 6, HeteroFL's). Its convolution backward counts
    a grouped convolution's weight gradient as dense (ignoring `groups`: a 64-channel depthwise
    3x3 convolution would cost 66x its forward to train); `_conv_backward` replaces it."""
    from torch.utils.flop_counter import FlopCounterMode  # imported here: client actors rarely count

    model.train(train)
    with FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward}
    ) as counter:
        if train:
            model(x).sum().backward()
        else:
            with torch.no_grad():
                model(x)
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / len(x)


def _conv_backward(
    grad_out_shape,
    x_shape,
    w_shape,
    _bias,
    _stride,
    _padding,
    _dilation,
    transposed,
    _output_padding,
    _groups,
    output_mask,
    out_shape=None,
    **kwargs,
) -> int:
    """A convolution's backward: the input's gradient (a transposed convolution of the output's
    gradient with the weight) and the weight's (a convolution of the input with the output's
    gradient, group by group) each take the forward's multiply-adds, grouped or not; the bias's
    gradient, like the forward's bias, counts nothing."""
    from torch.utils.flop_counter import conv_flop_count

    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (bool(output_mask[0]) + bool(output_mask[1]))


def saved_bytes(model: nn.Module, x: torch.Tensor, parts: Mapping[str, nn.Module] | None = None) -> dict[str, int]:
    """Bytes that autograd saves for backward in one training forward of `model` on `x`
    (parameters excluded, a storage counted once at its largest), attributed to the innermost of
    `parts` running when the storage is first saved ("" outside them), via saved-tensor hooks."""
    params = {p.data_ptr() for p in model.parameters()}
    owner: dict[int, str] = {}
    size: dict[int, int] = {}
    running: list[str] = []
    hooks = []
    for name, part in (parts or {}).items():
        hooks.append(part.register_forward_pre_hook(lambda m, a, name=name: running.append(name)))
        hooks.append(part.register_forward_hook(lambda m, a, out: running.pop() and None))

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            owner.setdefault(ptr, running[-1] if running else "")
            size[ptr] = max(size.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    model.train()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
        del out
    finally:
        for h in hooks:
            h.remove()
    by_part = dict.fromkeys([*(parts or {}), ""], 0)
    for ptr, n in size.items():
        by_part[owner[ptr]] += n
    return by_part


def activation_bytes(model: nn.Module, input_shape: tuple[int, ...]) -> float:
    """Bytes per sample that autograd saves for backward (parameters excluded)."""
    return sum(saved_bytes(model, _probe(input_shape)).values()) / _PROBE_BATCH


def measure(model: nn.Module, input_shape: tuple[int, ...]) -> ModelCost:
    """Measure a model variant: parameter count and bytes, FLOPs per sample, activations per sample."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    cost = ModelCost(
        num_params=sum(p.numel() for p in model.parameters()),
        param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        forward_flops=count_flops(model, input_shape, train=False),
        train_flops=count_flops(model, input_shape, train=True),
        activation_bytes=activation_bytes(model, input_shape),
    )
    model.load_state_dict(state)  # the probe's batch-norm updates leave no trace
    return cost


class CostCache:
    """`ModelCost` per variant key, measured on first use."""

    def __init__(self) -> None:
        self._costs: dict[Hashable, ModelCost] = {}

    def get(self, key: Hashable, build, input_shape: tuple[int, ...]) -> ModelCost:
        if key not in self._costs:
            self._costs[key] = measure(build(), input_shape)
        return self._costs[key]


def nbytes(weights: Mapping[str, np.ndarray]) -> int:
    """Bytes of a model state as sent: the sum of its arrays' sizes."""
    return int(sum(a.nbytes for a in weights.values()))


@dataclass(frozen=True)
class ClientTime:
    compute_s: float
    comm_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


def client_time(device: DeviceState, flops: float, bytes_down: int, bytes_up: int) -> ClientTime:
    """Time of one client's task: bits / bandwidth each way + latency each way, FLOPs / FLOP/s."""
    comm = 8 * bytes_down / device.down_bps + 8 * bytes_up / device.up_bps + 2 * device.latency_s
    return ClientTime(compute_s=flops / device.flops, comm_s=comm)


def energy_j(device: DeviceState, flops: float, bytes_moved: float) -> float:
    """A task's energy: FLOPs / 10^9 x J/GFLOP + bytes / 10^6 x J/MB."""
    return flops / 1e9 * device.energy_j_per_gflop + bytes_moved / 1e6 * device.energy_j_per_mb


@dataclass(frozen=True)
class Spent:
    """What a task took from its device: its columns on the virtual clock, and its energy."""

    flops: float
    bytes_down: int
    bytes_up: int
    compute_s: float
    comm_s: float
    energy_j: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s

    def columns(self) -> dict[str, float]:
        return {
            "flops": self.flops,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "total_s": self.total_s,
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "energy_j": self.energy_j,
        }


def spent(device: DeviceState, flops: float, bytes_down: int, bytes_up: int, cut_s: float | None = None) -> Spent:
    """What a task of `flops` and bytes takes on the device: all of it, or, for a task cut off
    `cut_s` seconds after it started (its device went offline), what it did by then. A task
    downloads (latency + bits / down), computes, then uploads (latency + bits / up); bytes and
    FLOPs are spent evenly over their phase."""
    t = client_time(device, flops, bytes_down, bytes_up)
    if cut_s is None or cut_s >= t.total_s:
        return Spent(flops, bytes_down, bytes_up, t.compute_s, t.comm_s, energy_j(device, flops, bytes_down + bytes_up))
    down_s = device.latency_s + 8 * bytes_down / device.down_bps
    up_s = device.latency_s + 8 * bytes_up / device.up_bps
    d = min(cut_s, down_s)
    c = min(max(cut_s - down_s, 0.0), t.compute_s)
    u = min(max(cut_s - down_s - t.compute_s, 0.0), up_s)
    share = lambda done, whole: done / whole if whole > 0 else 1.0
    f, bd, bu = flops * share(c, t.compute_s), int(bytes_down * share(d, down_s)), int(bytes_up * share(u, up_s))
    return Spent(f, bd, bu, c, d + u, energy_j(device, f, bd + bu))


def round_duration(totals: Sequence[float]) -> tuple[float, list[float]]:
    """A synchronous round: its duration (the slowest client) and each client's waiting time."""
    duration = max(totals, default=0.0)
    return duration, [duration - t for t in totals]

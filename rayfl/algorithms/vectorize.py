"""Vectorized clients (`ray.vectorize: K`): K clients of a round trained together in one batched
computation, with `torch.func.functional_call` + `vmap` over stacked parameters.

Each client keeps its own seeded batch sequence (the same as when it trains alone); step s
stacks every client's s-th batch (one index into the clients' samples, concatenated once a
call), padded to the longest with zero-weight samples, and a client that has run out of
batches (or diverged) sits the step out: its parameters and optimizer state are put back after
the step. The stacked parameters are laid out as autograd lays out their gradients (as a
width-1 probe finds them, once per variant and K on a host), so a step normally keeps each
gradient as it comes instead of copying it into another layout. The optimizer is the task's,
over the stacked parameters: SGD (momentum, weight decay) and Adam act elementwise, so each
client's slice moves as its own optimizer would; gradient clipping is applied per client. Results equal
sequential training up to float rounding of the batched products. Models with batch norm (its
statistics would take in the padding) or dropout (random draws are not kept per client in one
call) cannot be vectorized; group and layer norm, which normalize each sample, can.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from .base import ClientFailure, ClientResult, ClientTask
from ..config import ConfigError

if TYPE_CHECKING:
    from ..client import ClientContext, ClientData

Penalty = Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], torch.Tensor]
"""(stacked parameters, their initial values) -> a (K,) loss term per client (FedProx's)."""


def check_vectorizable(model: nn.Module, what: str) -> None:
    """`ConfigError` naming `ray.vectorize` when the model cannot be trained K clients at a time."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            raise ConfigError(f"ray.vectorize: {what} has batch norm (statistics over padded per-client batches); use norm gn, ln or none, or ray.vectorize: 1")
        if isinstance(m, nn.modules.dropout._DropoutNd):
            raise ConfigError(f"ray.vectorize: {what} has dropout (random draws cannot be kept per client); use ray.vectorize: 1")


def train_vectorized(
    tasks: Sequence[ClientTask], datas: Sequence["ClientData"], ctx: "ClientContext", penalty: Penalty | None = None
) -> list[ClientResult | ClientFailure]:
    """Local training of several clients of one model variant at once (see the module docstring)."""
    model = ctx.load(tasks[0].model, tasks[0].weights).train()
    names = [n for n, _ in model.named_parameters()]
    buffers = dict(model.named_buffers())
    device = ctx.device
    forward = vmap(lambda p, x: functional_call(model, (p, buffers), (x,)))
    stacked = {n: torch.stack([torch.as_tensor(t.weights[n]) for t in tasks]).to(device) for n in names}
    shape = tuple(datas[0].x.shape[1:])
    key = (tasks[0].model, len(tasks), shape)  # what the layout depends on
    if key not in ctx.layouts:
        ctx.layouts[key] = gradient_strides(stacked, lambda p: forward(p, torch.zeros((len(tasks), 1, *shape), dtype=datas[0].x.dtype, device=device)).sum())
    params = laid_out(stacked, ctx.layouts[key])
    initial = {n: p.detach().clone() for n, p in params.items()} if penalty is not None else {}
    spec = tasks[0].optimizer
    opt = dataclasses.replace(spec, grad_clip=None).build(params.values())
    plans = [list(ctx.batches(t, len(d))) for t, d in zip(tasks, datas)]
    k = len(tasks)
    # every client's samples in one tensor, a zero row last: step s gathers all clients' s-th batches in one index
    xs = torch.cat([*(d.x for d in datas), torch.zeros_like(datas[0].x[:1])])
    ys = torch.cat([*(d.y for d in datas), torch.zeros_like(datas[0].y[:1])])
    offsets = np.cumsum([0, *(len(d) for d in datas)])
    pad = int(offsets[-1])
    alive, total, samples, failure = [True] * k, [0.0] * k, [0] * k, {}
    for step in range(max(len(p) for p in plans)):
        active = [alive[i] and step < len(plans[i]) for i in range(k)]
        if not any(active):
            break
        width = max(len(plans[i][step]) for i in range(k) if active[i])
        index = np.full((k, width), pad)
        w = np.zeros((k, width), dtype=np.float32)
        for i in range(k):
            if active[i]:
                b = plans[i][step]
                index[i, : len(b)] = b + offsets[i]
                w[i, : len(b)] = 1.0 / len(b)
        index = torch.from_numpy(index).to(device)
        x, y, w = xs[index], ys[index], torch.from_numpy(w).to(device)
        opt.zero_grad(set_to_none=True)
        logits = forward(params, x)
        loss = (F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(k, width) * w).sum(1)
        mask = torch.tensor(active, device=device, dtype=loss.dtype)
        if penalty is not None:
            loss = loss + penalty(params, initial) * mask
        (loss * mask).sum().backward()
        if spec.grad_clip is not None:
            clip_per_client(params.values(), spec.grad_clip)
        kept = [i for i in range(k) if not active[i]]
        saved = snapshot(opt, params.values(), kept)
        opt.step()
        restore(opt, params.values(), kept, saved)
        values = loss.detach().tolist()  # one device-to-host copy a step
        for i in range(k):
            if active[i]:
                value = values[i]
                samples[i] += len(plans[i][step])
                if not math.isfinite(value):
                    alive[i], failure[i] = False, samples[i]
                total[i] += value * len(plans[i][step])
    out: list[ClientResult | ClientFailure] = []
    order = list(model.state_dict())
    for i, (task, data) in enumerate(zip(tasks, datas)):
        if i in failure:
            out.append(ClientFailure(task.client_id, task.round, "non-finite training loss", failure[i]))
            continue
        weights = {n: (params[n][i].detach().cpu().numpy().copy() if n in params else task.weights[n]) for n in order}
        out.append(ClientResult(task.client_id, task.round, weights, len(data), samples[i], total[i] / max(samples[i], 1)))
    return out


def gradient_strides(stacked: dict[str, torch.Tensor], probe: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """The memory layout (strides) autograd gives each stacked parameter's gradient, found by one
    backward of `probe` (a batched linear layer's weight gradient comes transposed); a gradient
    that is not dense (a stride-0 expansion) or never computed gets a dense layout."""
    leaves = {n: p.detach().requires_grad_(True) for n, p in stacked.items()}
    grads = torch.autograd.grad(probe(leaves), list(leaves.values()), allow_unused=True)
    return {n: (p if g is None else torch.empty_like(g, dtype=p.dtype, device="meta")).stride() for (n, p), g in zip(stacked.items(), grads)}


def laid_out(stacked: dict[str, torch.Tensor], strides: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The stacked parameters as leaves in the layout `strides` (`gradient_strides`), so that every
    step's AccumulateGrad keeps the gradient as it comes instead of copying it into the
    parameter's layout: on a CPU that copy of every stacked weight cost more than the batched
    products. The layout is found once per variant and K on a host (`ClientContext.layouts`):
    the probe cost 9% of a call."""
    return {n: torch.empty_strided(p.shape, strides[n], dtype=p.dtype, device=p.device).copy_(p).requires_grad_(True) for n, p in stacked.items()}


def clip_per_client(params, limit: float) -> None:
    """Each client's gradient norm over all its parameters clipped to `limit` (as torch's
    `clip_grad_norm_` would for that client alone)."""
    params = [p for p in params if p.grad is not None]
    norms = torch.stack([p.grad.flatten(1).pow(2).sum(1) for p in params]).sum(0).sqrt()
    coef = torch.clamp(limit / (norms + 1e-6), max=1.0)
    for p in params:
        p.grad.mul_(coef.view(-1, *[1] * (p.dim() - 1)))


def snapshot(opt: torch.optim.Optimizer, params, rows: list[int]) -> list[dict[str, torch.Tensor]]:
    """The slices `rows` of every parameter and its optimizer state (clients sitting a step out)."""
    if not rows:
        return []
    out = []
    for p in params:
        state = {key: v[rows].clone() for key, v in opt.state.get(p, {}).items() if torch.is_tensor(v) and v.shape == p.shape}
        out.append({"param": p.detach()[rows].clone(), **state})
    return out


def restore(opt: torch.optim.Optimizer, params, rows: list[int], saved: list[dict[str, torch.Tensor]]) -> None:
    with torch.no_grad():
        for p, kept in zip(params, saved):
            p[rows] = kept.pop("param")
            for key, value in kept.items():
                opt.state[p][key][rows] = value

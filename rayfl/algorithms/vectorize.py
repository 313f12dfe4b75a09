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
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from ..config import ConfigError, GradClip
from ..optim import CLIP
from .local import NON_FINITE, ClientContext, ClientData
from .messages import ClientFailure, ClientResult, ClientTask


def check_vectorizable(model: nn.Module, what: str) -> None:
    """`ConfigError` naming `ray.vectorize` when the model cannot be trained K clients at a time."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            raise ConfigError(
                f"ray.vectorize: {what} has batch norm (statistics over padded per-client batches); use norm gn, ln "
                "or none, or ray.vectorize: 1"
            )
        if isinstance(m, nn.modules.dropout._DropoutNd):
            raise ConfigError(
                f"ray.vectorize: {what} has dropout (random draws cannot be kept per client); use ray.vectorize: 1"
            )


IGNORED = -100
"""The label of padding: cross-entropy's `ignore_index`, so a data term that masks classes
(HeteroFL's -inf fill) gives padding a loss of 0, never 0 x inf."""


def train_vectorized(
    procedure: Any, tasks: Sequence[ClientTask], datas: Sequence[ClientData], ctx: ClientContext
) -> list[ClientResult | ClientFailure]:
    """Local training of several clients of one model variant at once (see the module docstring)
    on the procedure's own objective: its `data_loss` per sample over the stacked batches, with
    its `loss_inputs` stacked per client, plus its `penalty` over the stacked parameters
    (`fedavg.FedAvgClient`)."""
    model = ctx.load(tasks[0].model, tasks[0].weights).train()
    buffers = dict(model.named_buffers())
    forward = vmap(lambda p, x: functional_call(model, (p, buffers), (x,)))
    params = stacked_parameters(model, tasks, datas, ctx, forward)
    initial = {n: p.detach().clone() for n, p in params.items()} if procedure.penalty is not None else None
    inputs = {k: torch.stack(v).unsqueeze(1) for k, v in stacked_inputs(procedure, tasks, model).items()}
    spec = tasks[0].optimizer
    opt = dataclasses.replace(spec, grad_clip=None).build(params.values())
    steps = Steps(tasks, datas, ctx)
    for step in range(steps.count):
        active = steps.active(step)
        if not any(active):
            break
        x, y, w = steps.batch(step, active)
        opt.zero_grad(set_to_none=True)
        loss = (procedure.data_loss(forward(params, x), y, inputs, "none") * w).sum(1)
        mask = torch.tensor(active, device=x.device, dtype=loss.dtype)
        if initial is not None:
            loss = loss + procedure.penalty(params, initial, True) * mask
        (loss * mask).sum().backward()
        if spec.grad_clip is not None:
            clip_per_client(params.values(), spec.grad_clip)
        kept = [i for i, a in enumerate(active) if not a]
        saved = snapshot(opt, params.values(), kept)
        opt.step()
        restore(opt, params.values(), kept, saved)
        steps.record(step, active, loss.detach().tolist())  # one device-to-host copy a step
    return steps.outcomes(model, params)


def stacked_parameters(
    model: nn.Module, tasks: Sequence[ClientTask], datas: Sequence[ClientData], ctx: ClientContext, forward: Callable
) -> dict[str, torch.Tensor]:
    """The clients' parameters stacked (client first) as leaves in their gradients' layout,
    found once per (variant, K, input shape) on this host (`ClientContext.layouts`)."""
    stacked = {
        n: torch.stack([torch.as_tensor(t.weights[n]) for t in tasks]).to(ctx.device)
        for n, _ in model.named_parameters()
    }
    shape = tuple(datas[0].x.shape[1:])
    key = (tasks[0].model, len(tasks), shape)  # what the layout depends on
    if key not in ctx.layouts:
        probe = torch.zeros((len(tasks), 1, *shape), dtype=datas[0].x.dtype, device=ctx.device)
        ctx.layouts[key] = gradient_strides(stacked, lambda p: forward(p, probe).sum())
    return laid_out(stacked, ctx.layouts[key])


def stacked_inputs(procedure: Any, tasks: Sequence[ClientTask], model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """Each of the procedure's `loss_inputs`, one tensor per client."""
    out: dict[str, list[torch.Tensor]] = {}
    for t in tasks:
        for k, v in procedure.loss_inputs(t, model).items():
            out.setdefault(k, []).append(v)
    return out


class Steps:
    """The clients' seeded batch plans stepped in lockstep: step s gathers every active client's
    s-th batch in one index into their concatenated samples (a last row of zeros labelled
    `IGNORED` pads short batches: its loss is 0 whatever the logits, and its sample weight 0
    too), and keeps each client's loss and samples."""

    def __init__(self, tasks: Sequence[ClientTask], datas: Sequence[ClientData], ctx: ClientContext):
        self.tasks, self.datas = tasks, datas
        self.plans = [list(ctx.batches(t, len(d))) for t, d in zip(tasks, datas)]
        self.count = max(len(p) for p in self.plans)
        self.xs = torch.cat([*(d.x for d in datas), torch.zeros_like(datas[0].x[:1])])
        self.ys = torch.cat([*(d.y for d in datas), torch.full_like(datas[0].y[:1], IGNORED)])
        self.offsets = np.cumsum([0, *(len(d) for d in datas)])
        k = len(tasks)
        self.alive, self.total, self.samples, self.failure = [True] * k, [0.0] * k, [0] * k, {}

    def active(self, step: int) -> list[bool]:
        """Which clients take part in the step (alive, with a batch left)."""
        return [self.alive[i] and step < len(self.plans[i]) for i in range(len(self.plans))]

    def batch(self, step: int, active: Sequence[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(K, width, ...) inputs, (K, width) labels and sample weights 1 / batch size (0: padding)."""
        k, pad = len(self.plans), int(self.offsets[-1])
        width = max(len(self.plans[i][step]) for i in range(k) if active[i])
        index = np.full((k, width), pad)
        w = np.zeros((k, width), dtype=np.float32)
        for i in range(k):
            if active[i]:
                b = self.plans[i][step]
                index[i, : len(b)] = b + self.offsets[i]
                w[i, : len(b)] = 1.0 / len(b)
        index = torch.from_numpy(index).to(self.xs.device)
        return self.xs[index], self.ys[index], torch.from_numpy(w).to(self.xs.device)

    def record(self, step: int, active: Sequence[bool], values: Sequence[float]) -> None:
        """The step's per-client losses: samples and loss added up; a non-finite loss ends the client."""
        for i, value in enumerate(values):
            if active[i]:
                self.samples[i] += len(self.plans[i][step])
                if not math.isfinite(value):
                    self.alive[i], self.failure[i] = False, self.samples[i]
                self.total[i] += value * len(self.plans[i][step])

    def outcomes(self, model: nn.Module, params: dict[str, torch.Tensor]) -> list[ClientResult | ClientFailure]:
        out: list[ClientResult | ClientFailure] = []
        for i, (task, data) in enumerate(zip(self.tasks, self.datas)):
            if i in self.failure:
                out.append(ClientFailure.of(task, NON_FINITE, num_samples=self.failure[i]))
                continue
            weights = {
                n: (params[n][i].detach().cpu().numpy().copy() if n in params else task.weights[n])
                for n in model.state_dict()
            }
            out.append(
                ClientResult.of(
                    task,
                    weights=weights,
                    num_examples=len(data),
                    num_samples=self.samples[i],
                    train_loss=self.total[i] / max(self.samples[i], 1),
                )
            )
        return out


def gradient_strides(
    stacked: dict[str, torch.Tensor], probe: Callable[[dict[str, torch.Tensor]], torch.Tensor]
) -> dict[str, tuple[int, ...]]:
    """The memory layout (strides) autograd gives each stacked parameter's gradient, found by one
    backward of `probe` (a batched linear layer's weight gradient comes transposed); a gradient
    that is not dense (a stride-0 expansion) or never computed gets a dense layout."""
    leaves = {n: p.detach().requires_grad_(True) for n, p in stacked.items()}
    grads = torch.autograd.grad(probe(leaves), list(leaves.values()), allow_unused=True)
    return {
        n: (p if g is None else torch.empty_like(g, dtype=p.dtype, device="meta")).stride()
        for (n, p), g in zip(stacked.items(), grads)
    }


def laid_out(stacked: dict[str, torch.Tensor], strides: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The stacked parameters as leaves in the layout `strides` (`gradient_strides`), so that every
    step's AccumulateGrad keeps the gradient as it comes instead of copying it into the
    parameter's layout: on a CPU that copy of every stacked weight cost more than the batched
    products. The layout is found once per variant and K on a host (`ClientContext.layouts`):
    the probe cost 9% of a call."""
    return {
        n: torch.empty_strided(p.shape, strides[n], dtype=p.dtype, device=p.device).copy_(p).requires_grad_(True)
        for n, p in stacked.items()
    }


def clip_per_client(params, clip: GradClip) -> None:
    """Each client's gradients clipped as torch would for that client alone: their norm over all
    its parameters to `clip.max` (`clip_grad_norm_`), or each entry (`clip_grad_value_`, entry by
    entry whatever the client)."""
    params = [p for p in params if p.grad is not None]
    if clip.kind == "value":
        CLIP["value"](params, clip.max)
        return
    limit = clip.max
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
        state = {
            key: v[rows].clone() for key, v in opt.state.get(p, {}).items() if torch.is_tensor(v) and v.shape == p.shape
        }
        out.append({"param": p.detach()[rows].clone(), **state})
    return out


def restore(opt: torch.optim.Optimizer, params, rows: list[int], saved: list[dict[str, torch.Tensor]]) -> None:
    with torch.no_grad():
        for p, kept in zip(params, saved):
            p[rows] = kept.pop("param")
            for key, value in kept.items():
                opt.state[p][key][rows] = value

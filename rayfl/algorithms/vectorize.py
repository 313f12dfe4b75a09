"""Vectorized clients (`ray.vectorize: K`): K clients of a round trained together in one batched
computation, with `torch.func.functional_call` + `vmap` over stacked parameters and buffers.

Each client keeps its own seeded batch plan (the same as when it trains alone); step s stacks
every client's s-th batch (one gather from the clients' samples, concatenated once a call),
padded to the longest with zero-weight rows, and a client that has run out of batches sits the
step out: its parameters, buffers and optimizer state are put back after the step. Batch norm
(`rayfl.models.layers.RowBatchNorm`) takes each client's statistics over its real rows only, so
padding never leaks in (HeteroFL's static BN, FeDepth's and DepthFL's running statistics).

What crosses to the device does not grow with K: the call's weights once (clients that share
one global model expand one copy instead of stacking K), the batch plans of every step in one
copy, and after the last step one read of every client's losses and of each trained tensor's
max-abs per client (`OnDevice.nonfinite`). A client whose loss goes NaN or infinite fails with
the samples drawn up to that step, as it would alone; it trains on in its own slice, which no
other client reads.

The stacked parameters are laid out as autograd lays out their gradients (as a width-1 probe
finds them, once per variant and K on a host), so a step keeps each gradient as it comes. The
optimizer is the task's, over the stacked parameters: SGD (momentum, weight decay) and Adam act
elementwise, so each client's slice moves as its own optimizer would; gradient clipping is
applied per client. Results equal sequential training up to float rounding of the batched
products. Models with dropout (random draws are not kept per client in one call), or with batch
norm other than rayfl's, cannot be vectorized.
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
from ..models.layers import RowBatchNorm, real_rows
from ..optim import CLIP
from .local import NON_FINITE, ClientContext, ClientData, batch_plan
from .messages import ClientFailure, ClientResult, ClientTask, OnDevice


def check_vectorizable(model: nn.Module, what: str) -> None:
    """`ConfigError` naming `ray.vectorize` when the model cannot be trained K clients at a time."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, RowBatchNorm):
            raise ConfigError(
                f"ray.vectorize: {what} has a batch norm that would take statistics over padded per-client batches; "
                "use norm bn, sbn, gn, ln or none of rayfl's model families, or ray.vectorize: 1"
            )
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
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
    model = ctx.models.module(tasks[0].model).train()
    sources = [ctx.on_device(t.weights) for t in tasks]
    buffers = {n: stacked(sources, n).clone() for n, _ in model.named_buffers()}
    forward = vmap(lambda p, b, x, w: _rows_call(model, p, b, x, w))
    params = stacked_parameters(model, sources, datas, ctx, forward, buffers)
    initial = {n: p.detach().clone() for n, p in params.items()} if procedure.penalty is not None else None
    inputs = {
        k: torch.from_numpy(np.stack(vs)).to(ctx.device).unsqueeze(1)
        for k, vs in stacked_inputs(procedure, tasks, model).items()
    }
    spec = tasks[0].optimizer
    opt = dataclasses.replace(spec, grad_clip=None).build(params.values())
    plan = Plan(tasks, datas, ctx)
    losses = torch.zeros(plan.count, len(tasks), device=ctx.device)
    for step in range(plan.count):
        x, y, w, mask = plan.batch(step)
        kept = plan.resting(step)
        saved = snapshot(opt, params.values(), buffers.values(), kept)  # before the forward moves the statistics
        opt.zero_grad(set_to_none=True)
        with ctx.autocast():
            loss = (procedure.data_loss(forward(params, buffers, x, w), y, inputs, "none") * w).sum(1)
            if initial is not None:
                loss = loss + procedure.penalty(params, initial, batched=True) * mask
        (loss * mask).sum().backward()
        if spec.grad_clip is not None:
            clip_per_client(params.values(), spec.grad_clip)
        opt.step()
        restore(opt, params.values(), buffers.values(), kept, saved)
        losses[step] = loss.detach()
    return plan.outcomes(model, params, buffers, losses)


def _rows_call(model: nn.Module, params: dict, buffers: dict, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One client's forward inside `vmap`: its batch norm over its real rows (weight > 0)."""
    with real_rows(w):
        return functional_call(model, (params, buffers), (x,))


def stacked(sources: Sequence[dict[str, torch.Tensor]], name: str) -> torch.Tensor:
    """The clients' tensors `name` stacked client first: one copy expanded when they all share one
    dict (a round's global model), else stacked."""
    if all(s is sources[0] for s in sources):
        return sources[0][name].unsqueeze(0).expand(len(sources), *sources[0][name].shape)
    return torch.stack([s[name] for s in sources])


def stacked_parameters(
    model: nn.Module,
    sources: Sequence[dict[str, torch.Tensor]],
    datas: Sequence[ClientData],
    ctx: ClientContext,
    forward: Callable,
    buffers: dict[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The clients' parameters stacked (client first) as leaves in their gradients' layout,
    found once per (variant, K, input shape) on this host (`ClientContext.layouts`)."""
    k = len(sources)
    views = {n: stacked(sources, n) for n, _ in model.named_parameters()}
    shape = tuple(datas[0].x.shape[1:])
    key = (id(model), k, shape)  # what the layout depends on
    if key not in ctx.layouts:
        probe = torch.zeros((k, 2, *shape), dtype=datas[0].x.dtype, device=ctx.device)
        ones = torch.ones((k, 2), device=ctx.device)
        spare = {n: b.clone() for n, b in buffers.items()}  # the probe's statistics are not the clients'
        ctx.layouts[key] = gradient_strides(views, lambda p: forward(p, spare, probe, ones).sum())
    return laid_out(views, ctx.layouts[key])


def stacked_inputs(procedure: Any, tasks: Sequence[ClientTask], model: nn.Module) -> dict[str, list[np.ndarray]]:
    """Each of the procedure's `loss_inputs`, one host array per client."""
    out: dict[str, list[np.ndarray]] = {}
    for t in tasks:
        for k, v in procedure.loss_inputs(t, model).items():
            out.setdefault(k, []).append(v)
    return out


class Plan:
    """The clients' seeded batch plans stepped in lockstep, laid out for every step on the host
    and crossed to the device in one copy: step s gathers every client's s-th batch by one index
    into their concatenated samples (a last row of zeros labelled `IGNORED` pads short batches
    and stands in for a client with no batch left: its loss is 0 whatever the logits, and its
    sample weight 0 too)."""

    def __init__(self, tasks: Sequence[ClientTask], datas: Sequence[ClientData], ctx: ClientContext):
        self.tasks, self.datas = tasks, datas
        self.plans = [batch_plan(ctx.seed, t, len(d)) for t, d in zip(tasks, datas)]
        k = len(tasks)
        self.count = max(len(p) for p in self.plans)
        resting = [[i for i, p in enumerate(self.plans) if step >= len(p)] for step in range(self.count)]
        self.rest_starts = np.cumsum([0, *(len(r) for r in resting)])
        self.rest = torch.from_numpy(np.array([i for r in resting for i in r], dtype=np.int64)).to(ctx.device)
        self.xs = torch.cat([*(d.x for d in datas), torch.zeros_like(datas[0].x[:1])])
        self.ys = torch.cat([*(d.y for d in datas), torch.full_like(datas[0].y[:1], IGNORED)])
        offsets = np.cumsum([0, *(len(d) for d in datas)])
        pad = int(offsets[-1])
        index, weight, self.widths = [], [], []
        for step in range(self.count):
            width = max(len(p[step]) for p in self.plans if step < len(p))
            rows = np.full((k, width), pad)
            w = np.zeros((k, width), dtype=np.float32)
            for i, p in enumerate(self.plans):
                if step < len(p):
                    rows[i, : len(p[step])] = p[step] + offsets[i]
                    w[i, : len(p[step])] = 1.0 / len(p[step])
            index.append(rows.ravel())
            weight.append(w.ravel())
            self.widths.append(width)
        active = np.array([[step < len(p) for p in self.plans] for step in range(self.count)], dtype=np.float32)
        self.index = torch.from_numpy(np.concatenate(index)).to(ctx.device)
        self.weight = torch.from_numpy(np.concatenate(weight)).to(ctx.device)
        self.active = torch.from_numpy(active).to(ctx.device)
        self.starts = np.cumsum([0, *(k * w for w in self.widths)])

    def resting(self, step: int) -> torch.Tensor | None:
        """The clients with no batch left at `step` (a slice of the plan on the device), or None."""
        a, b = self.rest_starts[step], self.rest_starts[step + 1]
        return self.rest[a:b] if b > a else None

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(K, width, ...) inputs, (K, width) labels and sample weights 1 / batch size (0: padding),
        and (K,) which clients take part; slices of the plan already on the device."""
        k, a, b = len(self.plans), self.starts[step], self.starts[step + 1]
        rows = self.index[a:b]
        x = self.xs.index_select(0, rows).view(k, self.widths[step], *self.xs.shape[1:])
        y = self.ys.index_select(0, rows).view(k, self.widths[step])
        return x, y, self.weight[a:b].view(k, self.widths[step]), self.active[step]

    def outcomes(
        self,
        model: nn.Module,
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        losses: torch.Tensor,
    ) -> list[ClientResult | ClientFailure]:
        """Every client's outcome from one read of the losses and of its tensors' max-abs."""
        names = [n for n in model.state_dict() if (params.get(n, buffers.get(n))).is_floating_point()]
        stacked_state = {**params, **buffers}
        norms = [stacked_state[n].detach().flatten(1).abs().amax(1) for n in names]
        k = len(self.tasks)
        read = torch.cat([losses.flatten().double(), *(v.double() for v in norms)]).tolist()
        values, maxabs = read[: self.count * k], read[self.count * k :]
        out: list[ClientResult | ClientFailure] = []
        for i, (task, data) in enumerate(zip(self.tasks, self.datas)):
            total, samples, failed = 0.0, 0, None
            for step, batch in enumerate(self.plans[i]):
                value = values[step * k + i]
                samples += len(batch)
                if not math.isfinite(value):
                    failed = samples
                    break
                total += value * len(batch)
            if failed is not None:
                out.append(ClientFailure.of(task, NON_FINITE, num_samples=failed))
                continue
            nonfinite = [n for j, n in enumerate(names) if not math.isfinite(maxabs[j * k + i])]
            weights = OnDevice({n: stacked_state[n][i].detach() for n in model.state_dict()}, nonfinite)
            out.append(
                ClientResult.of(
                    task,
                    weights=weights,
                    num_examples=len(data),
                    num_samples=samples,
                    train_loss=total / max(samples, 1),
                )
            )
        return out


def gradient_strides(
    stacked: dict[str, torch.Tensor], probe: Callable[[dict[str, torch.Tensor]], torch.Tensor]
) -> dict[str, tuple[int, ...]]:
    """The memory layout (strides) autograd gives each stacked parameter's gradient, found by one
    backward of `probe` (a batched linear layer's weight gradient comes transposed); a gradient
    that is not dense (a stride-0 expansion) or never computed gets a dense layout."""
    leaves = {n: p.detach().contiguous().requires_grad_(True) for n, p in stacked.items()}
    grads = torch.autograd.grad(probe(leaves), list(leaves.values()), allow_unused=True)
    return {
        n: (p if g is None else torch.empty_like(g, dtype=p.dtype, device="meta")).stride()
        for (n, p), g in zip(leaves.items(), grads)
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


def snapshot(opt: torch.optim.Optimizer, params, buffers, rows: torch.Tensor | None) -> list[dict[str, torch.Tensor]]:
    """The slices `rows` (client indices on the device) of every parameter and its optimizer
    state, and of every buffer (clients sitting a step out)."""
    if rows is None:
        return []
    out = []
    for p in params:
        state = {
            key: v.index_select(0, rows)
            for key, v in opt.state.get(p, {}).items()
            if torch.is_tensor(v) and v.shape == p.shape
        }
        out.append({"param": p.detach().index_select(0, rows), **state})
    out += [{"buffer": b.index_select(0, rows)} for b in buffers]
    return out


def restore(
    opt: torch.optim.Optimizer, params, buffers, rows: torch.Tensor | None, saved: list[dict[str, torch.Tensor]]
) -> None:
    if rows is None:
        return
    params = list(params)
    with torch.no_grad():
        for p, kept in zip(params, saved):
            p.index_copy_(0, rows, kept.pop("param"))
            for key, value in kept.items():
                opt.state[p][key].index_copy_(0, rows, value)
        for b, kept in zip(buffers, saved[len(params) :]):
            b.index_copy_(0, rows, kept["buffer"])

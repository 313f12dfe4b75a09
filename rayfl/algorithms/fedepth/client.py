"""FeDepth's client: depth-wise sequential learning (the paper's problem (1), one stage per
block: `train_stage`), or mutual knowledge distillation for surplus memory (`train_mutual`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...models import to_numpy
from ..base import ClientProcedure
from ..local import ClientContext, ClientData
from ..messages import ClientResult
from .memory import STEM_EXCLUDES
from .policy import FeDepthTask


def mkd_loss(logits: torch.Tensor, peers: Sequence[torch.Tensor], y: torch.Tensor, lam: float) -> torch.Tensor:
    """One model's MKD loss: CE(z, y) + lambda / (M - 1) sum_m' KL(softmax(z_m') || softmax(z)),
    peers detached, KL averaged over the batch (Deep Mutual Learning, Zhang et al. 2018)."""
    log_p = F.log_softmax(logits, 1)
    kl = sum(F.kl_div(log_p, F.softmax(z.detach(), 1), reduction="batchmean") for z in peers)
    return F.cross_entropy(logits, y) + lam / len(peers) * kl


class FeDepthClient(ClientProcedure):
    """Depth-wise sequential training (problem (1) per block), or MKD for surplus memory."""

    def run(self, task: FeDepthTask, data: ClientData, ctx: ClientContext) -> ClientResult:
        """Problem (1) block by block (`train_stage`), or MKD when the task carries peers."""
        if task.peers:
            return train_mutual(task, data, ctx)
        model = ctx.load(task.model, task.weights)
        shared = task.optimizer.build(model.parameters()) if task.drift else None
        total, samples = 0.0, 0
        for j, block in enumerate(task.blocks):
            total, n = train_stage(model, task, j, block, data, ctx, shared)  # the code reports the last stage's loss
            samples += n
        model.requires_grad_(True)
        per_stage = samples // len(task.blocks)
        metrics = {"stages": float(len(task.blocks))}
        return ClientResult.of(
            task,
            weights=to_numpy(model),
            num_examples=len(data),
            num_samples=samples,
            train_loss=total / max(per_stage, 1),
            metrics=metrics,
        )


def train_stage(
    model: nn.Module,
    task: FeDepthTask,
    j: int,
    block: Sequence[int],
    data: ClientData,
    ctx: ClientContext,
    shared: torch.optim.Optimizer | None = None,
) -> tuple[float, int]:
    """Stage j of depth-wise sequential learning (problem (1)): block j and its head (the skip
    link's, or m-FeDepth's auxiliary classifier after the block) trained for the task's epochs on
    the output of the frozen layers before it, the stem trained with the first block only; a
    fresh optimizer over the stage's trainable parameters unless `shared` (`frozen_drift`).
    Returns the stage's summed loss (x batch size) and samples."""
    stem = [m for name, m in model.named_children() if f"{name}." not in STEM_EXCLUDES]
    stem_params = [
        p for name, p in model.named_parameters() if not name.startswith(STEM_EXCLUDES)
    ]  # a transformer's position embedding has no module
    head = model.aux[str(block[-1])] if task.aux and block[-1] < len(model.layers) - 1 else model.head
    trainable = [model.layers[i] for i in block] + [head] + (stem if j == 0 else [])
    model.requires_grad_(False)
    for m in trainable:
        m.train()
    params = list(
        {id(p): p for p in [*(p for m in trainable for p in m.parameters()), *(stem_params if j == 0 else [])]}.values()
    )
    for p in params:
        p.requires_grad_(True)
    optimizer = shared or task.optimizer.build(params)
    frozen = [model.layers[i] for i in range(task.skip, block[0])]
    for m in frozen + (stem if j else []):
        m.eval()  # frozen: batch-statistics norms (the default) as in training, running ones fixed
    cache = prefix(model, task, frozen, data) if task.cache and j else None
    loss_sum, samples = 0.0, 0
    for b in ctx.batches(task, len(data), purpose=f"stage-{j}"):
        x, y = data.batch(b)
        if cache is not None:
            z = cache[b]
        elif j == 0:
            z = model.enter(x, task.skip)
        else:
            with torch.no_grad():
                z = model.enter(x, task.skip)
                for m in frozen:
                    z = m(z)
        for i in block:
            z = model.layers[i](z)
        loss = F.cross_entropy(model.exit(z, block[-1], task.aux), y)
        optimizer.zero_grad(set_to_none=not task.drift)
        loss.backward()
        optimizer.step()
        loss_sum += ctx.finite(float(loss.detach())) * len(b)
        samples += len(b)
    return loss_sum, samples


def prefix(model: nn.Module, task: FeDepthTask, frozen: Sequence[nn.Module], data: ClientData) -> torch.Tensor:
    """The frozen prefix's outputs for every sample, in batches of the task's size."""
    out = []
    with torch.no_grad():
        for i in range(0, len(data), task.batch_size):
            z = model.enter(data.x[i : i + task.batch_size], task.skip)
            for m in frozen:
                z = m(z)
            out.append(z)
    return torch.cat(out)


def train_mutual(task: FeDepthTask, data: ClientData, ctx: ClientContext) -> ClientResult:
    """The global model and its peers trained jointly on each batch; only the global one is uploaded."""
    models = [ctx.load(task.model, task.weights)] + [ctx.build(task.model) for _ in task.peers]
    for m, w in zip(models[1:], task.peers):
        m.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in w.items()})
    for m in models:
        m.train()
    optimizers = [task.optimizer.build(m.parameters()) for m in models]
    total, samples = 0.0, 0
    for b in ctx.batches(task, len(data)):
        x, y = data.batch(b)
        logits = [m(x) for m in models]
        for k, (m, opt) in enumerate(zip(models, optimizers)):
            loss = mkd_loss(logits[k], logits[:k] + logits[k + 1 :], y, task.mkd_lambda)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if k == 0:
                total += ctx.finite(float(loss.detach())) * len(b)
        samples += len(b)
    keep = {"peers": [to_numpy(m) for m in models[1:]]}
    return ClientResult.of(
        task,
        weights=to_numpy(models[0]),
        num_examples=len(data),
        num_samples=samples,
        train_loss=total / max(samples, 1),
        metrics={"stages": 1.0},
        keep=keep,
    )

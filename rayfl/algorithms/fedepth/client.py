"""FeDepth's client: depth-wise sequential learning (the paper's problem (1), one `Stage` per
block), or mutual knowledge distillation for surplus memory (`mutual_step`)."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..base import ClientProcedure
from ..local import Batch, ClientContext, ClientData, LocalState, Tagged, Trained
from .memory import STEM_EXCLUDES
from .policy import FeDepthTask


def mkd_loss(logits: torch.Tensor, peers: Sequence[torch.Tensor], y: torch.Tensor, lam: float) -> torch.Tensor:
    """One model's MKD loss: CE(z, y) + lambda / (M - 1) sum_m' KL(softmax(z_m') || softmax(z)),
    peers detached, KL averaged over the batch (Deep Mutual Learning, Zhang et al. 2018)."""
    log_p = F.log_softmax(logits, 1)
    kl = sum(F.kl_div(log_p, F.softmax(z.detach(), 1), reduction="batchmean") for z in peers)
    return F.cross_entropy(logits, y) + lam / len(peers) * kl


class Stage:
    """Stage j of depth-wise sequential learning (problem (1)): block j and its head (the skip
    link's, or m-FeDepth's auxiliary classifier after the block) trained for the task's epochs on
    the output of the frozen layers before it, the stem trained with the first block only; a
    fresh optimizer over the stage's trainable parameters (cleared per client) unless `shared`
    (`frozen_drift`). Set up on construction (the model's trainable set and modes)."""

    def __init__(
        self,
        model: nn.Module,
        task: FeDepthTask,
        j: int,
        block: Sequence[int],
        data: ClientData,
        ctx: ClientContext,
        shared: torch.optim.Optimizer | None = None,
    ):
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
            {
                id(p): p for p in [*(p for m in trainable for p in m.parameters()), *(stem_params if j == 0 else [])]
            }.values()
        )
        for p in params:
            p.requires_grad_(True)
        self.model, self.task, self.j, self.block = model, task, j, block
        self.optimizer = shared or ctx.optimizer(task.optimizer, params, slot=f"stage-{j}")
        self.frozen = [model.layers[i] for i in range(task.skip, block[0])]
        for m in self.frozen + (stem if j else []):
            m.eval()  # frozen: batch-statistics norms (the default) as in training, running ones fixed
        self.cache = prefix(model, task, self.frozen, data) if task.cache and j else None

    def step(self, batch: Batch) -> torch.Tensor:
        """One step of the stage on one batch; returns its loss."""
        model, task = self.model, self.task
        x, y = batch
        if self.cache is not None:
            z = self.cache.index_select(0, batch.index)
        elif self.j == 0:
            z = model.enter(x, task.skip)
        else:
            with torch.no_grad():
                z = model.enter(x, task.skip)
                for m in self.frozen:
                    z = m(z)
        for i in self.block:
            z = model.layers[i](z)
        loss = F.cross_entropy(model.exit(z, self.block[-1], task.aux), y)
        self.optimizer.zero_grad(set_to_none=not task.drift)
        loss.backward()
        self.optimizer.step()
        return loss.detach()


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


class FeDepthClient(ClientProcedure):
    """Depth-wise sequential training (problem (1) per block, `Stage`), or mutual knowledge
    distillation (MKD) for surplus memory when the task carries peers: the global model and its
    peers trained jointly on each batch, only the global one uploaded."""

    def init(self, task: FeDepthTask, ctx: ClientContext) -> LocalState:
        model = ctx.load(task.model, task.weights)
        if task.peers:
            models = [model.train()] + [
                ctx.load(task.model, w, slot=f"peer-{i}").train() for i, w in enumerate(task.peers)
            ]
            optimizers = [ctx.optimizer(task.optimizer, m, slot=f"mkd-{i}") for i, m in enumerate(models)]
            return LocalState(model, optimizers[0], extras=(models, optimizers, task.mkd_lambda))
        return LocalState(model, ctx.optimizer(task.optimizer, model) if task.drift else None)

    def schedule(self, task: FeDepthTask, state: LocalState, data: ClientData, ctx: ClientContext) -> Iterator[Any]:
        """MKD: the task's batches; depth-wise: each stage's own pass, its batches tagged with it."""
        if task.peers:
            yield from ctx.batches(task, data)
            return
        for j, block in enumerate(task.blocks):
            stage = Stage(state.model, task, j, block, data, ctx, state.optimizer)
            for b in ctx.batches(task, data, purpose=f"stage-{j}"):
                yield Tagged(stage, b)

    def step(self, state: LocalState, item: Any) -> dict[str, torch.Tensor]:
        if isinstance(item, Tagged):
            return {f"stage-{item.tag.j}": item.tag.step(item.batch)}
        models, optimizers, lam = state.extras
        return {"loss": mutual_step(models, optimizers, item, lam)}

    def final(self, task: FeDepthTask, state: LocalState, ctx: ClientContext) -> Trained:
        """The global model's tensors; depth-wise, the last stage's mean loss (as the code reports
        it); MKD, the peers kept for the client's next round."""
        weights = ctx.tensors(state.model)
        if task.peers:
            models = state.extras[0]
            return Trained(weights, metrics={"stages": 1.0}, keep={"peers": [ctx.tensors(m) for m in models[1:]]})
        state.model.requires_grad_(True)
        last = f"stage-{len(task.blocks) - 1}"
        return Trained(
            weights, metrics={"stages": float(len(task.blocks))}, train_loss=lambda losses: losses.mean(last)
        )


def mutual_step(
    models: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer], batch: Batch, lam: float
) -> torch.Tensor:
    """One MKD step: every model's `mkd_loss` against the others' logits, each stepped in turn;
    returns the global model's (the first's) loss."""
    x, y = batch
    logits = [m(x) for m in models]
    first = None
    for k, (m, opt) in enumerate(zip(models, optimizers)):
        loss = mkd_loss(logits[k], logits[:k] + logits[k + 1 :], y, lam)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if k == 0:
            first = loss.detach()
    return first

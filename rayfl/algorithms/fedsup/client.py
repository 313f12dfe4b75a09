"""FedSup's client (Alg. 1 l. 7-11): per batch M sub-nets under the sandwich rule, the others
distilled in place from the largest's soft predictions (Eq. 6-7), gradients accumulated, one step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from ... import rng
from ...models.supernet import Subnet, SupernetConfig, largest, random_subnet, smallest
from ...types import ClientId, Round
from ..base import ClientProcedure
from ..local import ClientContext, ClientData, LocalState, Tagged, Trained
from ..messages import ClientTask


@dataclass(frozen=True, kw_only=True)
class FedSupTask(ClientTask):
    subnets: int = 1
    sandwich: bool = True
    inplace_distill: bool = True
    temperature: float = 1.0
    distill_weight: float = 1.0


def step_subnets(
    config: SupernetConfig, seed: int, round: Round, client: ClientId, step: int, m: int, sandwich: bool, distill: bool
) -> list[Subnet]:
    """The M sub-nets of one local iteration, keyed by (seed, round, client, step): the largest
    first when distilling or sandwiching (the teacher), then random ones, the smallest last under
    the sandwich rule with M >= 3; one random sub-net when M = 1 (Alg. 1 l. 8)."""
    g = rng.generator(seed, f"subnets-{step}", round, client)
    if m == 1:
        return [random_subnet(config, g)]
    first = [largest(config)] if distill or sandwich else [random_subnet(config, g)]
    last = [smallest(config)] if sandwich and m >= 3 else []
    return first + [random_subnet(config, g) for _ in range(m - 1 - len(last))] + last


def distill_loss(
    logits: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, weight: float = 1.0
) -> torch.Tensor:
    """In-place distillation (Eq. 7, with Sec. 3.3.2's temperature T and balance lambda, as
    Hinton et al.): lambda T^2 [-sum softmax(z_T / T) log softmax(z / T)] + (1 - lambda) CE(z, y),
    batch means, z_T the largest's detached prediction. The paper gives no values; T = 1,
    lambda = 1 (soft targets alone) is the public code's `KLLossSoft`."""
    soft = (
        weight
        * temperature**2
        * -(F.softmax(teacher.detach() / temperature, 1) * F.log_softmax(logits / temperature, 1)).sum(1).mean()
    )
    return (
        soft if weight == 1 else soft + (1 - weight) * F.cross_entropy(logits, labels)
    )  # no label loss to build at lambda = 1


class FedSupClient(ClientProcedure):
    """Per batch, the M sub-nets of `step_subnets`: the first on the labels, the others on its
    soft predictions (in-place distillation) or the labels; gradients accumulated, one step; the
    supernet left at its first sub-net."""

    def init(self, task: FedSupTask, ctx: ClientContext) -> LocalState:
        model = ctx.load(task.model, task.weights).train()
        return LocalState(model, ctx.optimizer(task.optimizer, model), extras=(task, ctx.seed))

    def schedule(self, task: FedSupTask, state: LocalState, data: ClientData, ctx: ClientContext) -> Iterator[Tagged]:
        """The task's batches, each tagged with its iteration's number."""
        return (Tagged(step, b) for step, b in enumerate(ctx.batches(task, data)))

    def step(self, state: LocalState, item: Tagged) -> torch.Tensor:
        """Alg. 1 l. 7-11 on one batch; returns the first sub-net's loss."""
        (task, seed), model = state.extras, state.model
        x, y = item.batch
        subnets = step_subnets(
            task.model, seed, task.round, task.client_id, item.tag, task.subnets, task.sandwich, task.inplace_distill
        )
        state.optimizer.zero_grad(set_to_none=True)
        model.set_active(subnets[0])
        teacher = model(x)
        loss = F.cross_entropy(teacher, y)
        loss.backward()
        for s in subnets[1:]:
            model.set_active(s)
            z = model(x)
            (
                distill_loss(z, teacher, y, task.temperature, task.distill_weight)
                if task.inplace_distill
                else F.cross_entropy(z, y)
            ).backward()
        model.set_active(subnets[0])
        state.optimizer.step()
        return loss.detach()

    def final(self, task: FedSupTask, state: LocalState, ctx: ClientContext) -> Trained:
        state.model.set_active(largest(task.model))
        return Trained(ctx.tensors(state.model))

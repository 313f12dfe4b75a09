"""FeDepth's memory-adaptive decomposition: what training each layer costs, measured once per
model variant, and the fewest consecutive blocks whose training fits a budget (`docs/papers.md`,
FeDepth; the package docstring says how the pieces meet)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import nn

from ...config import ConfigError
from ...devices.cost import flops_on, saved_bytes

_PROBE = 2


def decompose(costs: Sequence[float], budget: float) -> list[list[int]]:
    """The fewest consecutive blocks of layers whose summed training cost fits `budget`, cut
    greedily from the input side (the paper's Fig. 3: costs {3, 2, 1, .5, .5, .5} GB give
    [[0], [1, 2], [3, 4, 5]] under 3 GB and [[0, 1], [2, 3, 4, 5]] under 5 GB). Greedy is
    optimal here: taking as many layers as fit never leaves a later cut worse off.
    `ConfigError` when one layer alone exceeds the budget (partial training takes over)."""
    blocks: list[list[int]] = []
    used = math.inf
    for i, cost in enumerate(costs):
        if cost > budget:
            raise ConfigError(f"memory budget: layer {i} alone needs {cost:.4g}, more than the budget {budget:.4g}")
        if used + cost > budget:
            blocks.append([])
            used = 0.0
        blocks[-1].append(i)
        used += cost
    return blocks


@dataclass(frozen=True)
class PartCost:
    """One part of the network (stem, a layer, a classifier), per sample where per sample."""

    param_bytes: int
    saved_bytes: float
    """Bytes autograd keeps for its backward, per sample (its activations in training)."""
    output_bytes: float
    """Bytes of its output per sample (what a cached frozen prefix holds)."""
    forward_flops: float
    train_flops: float
    """Forward and backward, input gradient included."""


@dataclass(frozen=True)
class LayerCosts:
    stem: PartCost
    layers: tuple[PartCost, ...]
    head: PartCost
    aux: Mapping[int, PartCost]
    param_bytes: int
    """The whole model's weights (frozen or not, every stage holds them)."""


STEM_EXCLUDES = ("layers.", "head.", "aux.")
"""State-dict prefixes that are not the stem: everything else is (trained with the first block)."""


class _Enter(nn.Module):
    """A depth-sliceable model's stem as a module (`model.enter`), for the FLOP counter."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.enter(x)


def measure_layers(model: nn.Module, input_shape: tuple[int, ...]) -> LayerCosts:
    """Measure each part of a depth-sliceable model (`preresnet20`, `transformer`: a stem
    reached through `enter`, `layers`, a `head`, optional `aux` classifiers) once: its saved
    activations within one training forward of the whole model (each storage attributed to the
    part that first saves it, the stem's being those outside every layer and the head, so the
    parts add up to the model's `ModelCost.activation_bytes`), its parameters, and its FLOPs on
    the input it receives there (`torch.utils.flop_counter`)."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(_PROBE, *input_shape, generator=torch.Generator().manual_seed(0))
    parts = {**{f"layers.{i}": m for i, m in enumerate(model.layers)}, "head": model.head}
    inputs: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            inputs[name] = args[0].detach()

        return hook

    hooks = [m.register_forward_pre_hook(keep(name)) for name, m in parts.items()]
    try:
        saved = saved_bytes(model, x, parts)
    finally:
        for h in hooks:
            h.remove()
    outputs = {name: inputs[nxt] for name, nxt in zip(list(parts)[:-1], list(parts)[1:])}
    nbytes_of = lambda params: sum(p.numel() * p.element_size() for p in params)

    def cost(
        part: nn.Module,
        z: torch.Tensor,
        kept: int,
        out: torch.Tensor | None,
        params: int | None = None,
        grad_in: bool = True,
    ) -> PartCost:
        with torch.no_grad():
            out = part(z) if out is None else out
        return PartCost(
            param_bytes=nbytes_of(part.parameters()) if params is None else params,
            saved_bytes=kept / _PROBE,
            output_bytes=out[0].numel() * out.element_size(),
            forward_flops=flops_on(part, z, train=False),
            train_flops=flops_on(part, z.clone().requires_grad_(grad_in), train=True),
        )

    costs = {name: cost(m, inputs[name], saved[name], outputs.get(name)) for name, m in parts.items()}
    stem_params = nbytes_of(p for n, p in model.named_parameters() if not n.startswith(STEM_EXCLUDES))
    stem = cost(_Enter(model), x, saved[""], inputs["layers.0"], stem_params, grad_in=False)
    aux = {}
    for key, head in getattr(model, "aux", {}).items():
        z = outputs[f"layers.{key}"]
        aux[int(key)] = cost(head, z, sum(saved_bytes(head, z.clone().requires_grad_()).values()), None)
    model.load_state_dict(state)
    return LayerCosts(
        stem,
        tuple(costs[f"layers.{i}"] for i in range(len(model.layers))),
        costs["head"],
        aux,
        nbytes_of(model.parameters()),
    )


@dataclass(frozen=True)
class Plan:
    """How one client trains in a round: its blocks (layer indices), the first layer it trains
    (> 0: partial training), how many models it trains jointly (> 1: MKD), and whether its
    frozen prefix's outputs are cached."""

    blocks: tuple[tuple[int, ...], ...]
    skip: int = 0
    models: int = 1
    cache: bool = False


def layer_memory(costs: LayerCosts, batch_size: int, slots: int, first: int | None) -> list[float]:
    """Bytes to train each layer in a block: its gradients and `slots` optimizer copies, and one
    batch of its activations; the stem's are added to layer `first` (the first trained; None:
    left out, as the paper's Table 1 leaves it out of B1)."""
    out = [(1 + slots) * c.param_bytes + batch_size * c.saved_bytes for c in costs.layers]
    if first is not None:
        out[first] += (1 + slots) * costs.stem.param_bytes + batch_size * costs.stem.saved_bytes
    return out


def stage_overhead(costs: LayerCosts, batch_size: int, slots: int, exits: Sequence[PartCost]) -> float:
    """What every stage holds beside its block: the whole model's weights and the training of
    its classifier (the costliest of `exits`). The frozen prefix runs without autograd, so its
    transient activations are gone before the block's are kept."""
    return costs.param_bytes + max((1 + slots) * e.param_bytes + batch_size * e.saved_bytes for e in exits)


def plan(
    costs: LayerCosts,
    budget: float,
    batch_size: int,
    slots: int,
    exits: Sequence[PartCost],
    *,
    num_examples: int,
    memory: str,
    cache: str,
    mkd: int,
) -> Plan | None:
    """A client's plan under its memory budget (bytes). MKD with up to `mkd` models when the
    budget holds two full trainings or more (the whole model's training memory, as measured for
    the width budgets). Else the decomposition of the layers from the first one whose every
    successor fits alone (partial training skips the layers before it). `memory: blocks` puts
    each block's own training against the budget, as the paper's Table 1 compares blocks with
    widths; `stage` counts all a stage holds: the stem with the first block, the classifier's
    training and every weight (`stage_overhead`). None when not even the last layer fits."""
    full = sum(layer_memory(costs, batch_size, slots, 0)) + stage_overhead(costs, batch_size, slots, [costs.head])
    everything = (tuple(range(len(costs.layers))),)
    if mkd > 1 and budget >= 2 * full:
        return Plan(everything, models=int(min(mkd, budget // full)))
    room = budget - (stage_overhead(costs, batch_size, slots, exits) if memory == "stage" else 0.0)
    for skip in range(len(costs.layers)):
        need = layer_memory(costs, batch_size, slots, skip if memory == "stage" else None)[skip:]
        if max(need) <= room:
            blocks = tuple(tuple(skip + i for i in b) for b in decompose(need, room))
            widest = max(sum(need[i - skip] for i in b) for b in blocks)
            prefix = costs.layers[blocks[-1][0] - 1].output_bytes * num_examples if len(blocks) > 1 else 0.0
            cached = cache == "always" or (cache == "auto" and len(blocks) > 1 and widest + prefix <= room)
            return Plan(blocks, skip, cache=cached)
    return None


# --------------------------------------------------------------------------- config and task

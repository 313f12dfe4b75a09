"""HeteroFL's client: local SGD on its width's sub-model with Sec. 3.2's masked cross-entropy."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch import nn

from ..fedavg import FedAvgClient, cross_entropy
from .policy import HeteroFLTask, masked_logits


class HeteroFLClient(FedAvgClient):
    """Local SGD on the sub-model with the masked cross-entropy of Sec. 3.2."""

    def loss_inputs(self, task: HeteroFLTask, model: nn.Module) -> dict[str, np.ndarray]:
        """The client's label split as a class mask."""
        mask = np.zeros(model_classes(model), dtype=bool)
        mask[list(task.label_split)] = True
        return {"mask": mask}

    def data_loss(
        self, logits: torch.Tensor, y: torch.Tensor, inputs: Mapping[str, torch.Tensor], reduction: str = "mean"
    ) -> torch.Tensor:
        """Sec. 3.2's masked cross-entropy (a mask per client when vectorized: clients of one
        width train together, `ray.vectorize`)."""
        return cross_entropy(masked_logits(logits, inputs["mask"], self.config.algorithm.mask), y, reduction)


def model_classes(model: nn.Module) -> int:
    return [m for m in model.modules() if isinstance(m, nn.Linear)][-1].out_features

"""Evaluation of model variants on the central test set, with static-BN calibration."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .config import ModelConfig
from .data import Clients
from .models import ModelCache
from .types import Weights


class Evaluator:
    """Test-set predictions of model variants, with HeteroFL's static-BN calibration on request."""

    def __init__(self, clients: Clients, models: ModelCache, batch_size: int, eval_clients: int):
        self.clients = clients
        """The federation's clients (what static-BN calibration may read)."""
        x_test, y_test = clients.test_set(eval_clients)
        self.x_test = x_test  # numpy: shipped through the object store zero-copy
        self.y = torch.tensor(y_test)
        self.models = models
        self.batch_size = batch_size

    def logits(self, weights: Weights, variant: ModelConfig, calibrate: Sequence[np.ndarray] | None = None) -> torch.Tensor:
        """Logits of the whole test set. With `calibrate` (batches of training inputs), batch
        norm statistics are first recomputed as a cumulative average over those batches (sBN)."""
        if calibrate is None:
            model = self.models.load(variant, weights)
        else:
            model = self.models.load(variant.model_copy(update={"norm": "bn", "scaler": 1.0}), weights, strict=False)
            bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
            for bn in bns:
                bn.momentum = None  # cumulative moving average: every batch weighs the same
                bn.reset_running_stats()
            model.train()
            with torch.no_grad():
                for x in calibrate:
                    model(torch.from_numpy(x))
        model.eval()
        with torch.no_grad():
            batches = (torch.tensor(self.x_test[i : i + self.batch_size]) for i in range(0, len(self.y), self.batch_size))
            return torch.cat([model(x) for x in batches])

    def __call__(self, weights: Weights, variant: ModelConfig) -> dict[str, float]:
        """Accuracy and mean cross-entropy of the global model on the central test set."""
        return scores(self.logits(weights, variant), self.y)


def scores(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    return {"accuracy": float((logits.argmax(1) == y).double().mean()), "loss": float(F.cross_entropy(logits, y))}

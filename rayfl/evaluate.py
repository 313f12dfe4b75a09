"""Evaluation of model variants on the central test set."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import ModelConfig
from .data import Clients
from .models import ModelCache
from .types import Weights


class Evaluator:
    """Test-set predictions of model variants."""

    def __init__(self, clients: Clients, models: ModelCache, batch_size: int, eval_clients: int):
        self.clients = clients
        """The federation's clients (what a policy's evaluation may read: HeteroFL's static BN, personalization)."""
        x_test, y_test = clients.test_set(eval_clients)
        self.x_test = x_test  # numpy: shipped through the object store zero-copy
        self.y = torch.tensor(y_test)
        self.models = models
        self.batch_size = batch_size

    def logits(self, weights: Weights, variant: ModelConfig) -> torch.Tensor:
        """Logits of the whole test set under the variant loaded with `weights`."""
        return self.logits_of(self.models.load(variant, weights))

    def logits_of(self, model: torch.nn.Module) -> torch.Tensor:
        """Logits of the whole test set under `model` (eval mode, no grad)."""
        model.eval()
        with torch.no_grad():
            batches = (
                torch.tensor(self.x_test[i : i + self.batch_size]) for i in range(0, len(self.y), self.batch_size)
            )
            return torch.cat([model(x) for x in batches])

    def __call__(self, weights: Weights, variant: ModelConfig) -> dict[str, float]:
        """Accuracy and mean cross-entropy of the global model on the central test set."""
        return scores(self.logits(weights, variant), self.y)


def scores(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    return {"accuracy": float((logits.argmax(1) == y).double().mean()), "loss": float(F.cross_entropy(logits, y))}

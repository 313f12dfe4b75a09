"""Initial and personalized accuracy per client (FedSup Sec. 4.1, after Oh et al. 2021, FedBABU).

Initial accuracy: the model as the server sends it, on each client's own test data. Personalized
accuracy: the same model with its head (the last linear layer) fine-tuned on the client's
training data for a few epochs, body frozen, then on the client's own test data. A client's
test data is its test split where the partition defines one (shards), else the central test
samples of the classes it holds. Reported as the mean and standard deviation over clients, as
the paper's tables (not over seeds).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import rng
from ..config import ModelConfig
from ..data import Clients
from ..evaluate import Evaluator
from ..types import ClientId, Weights
from .local import epoch_batches
from .messages import FederationContext


def client_test_indices(
    test_split: Sequence[np.ndarray] | None, histogram: np.ndarray, y_test: np.ndarray, client: int
) -> np.ndarray:
    """A client's test samples: its test split, or the central test samples of its classes."""
    if test_split is not None:
        return np.asarray(test_split[client])
    return np.flatnonzero(histogram[client][y_test] > 0)


def own_test_rows(context: FederationContext, y_test: np.ndarray) -> Iterator[tuple[ClientId, np.ndarray]]:
    """Each client with training samples and test rows of its own, with those rows of the
    central test set (`client_test_indices`)."""
    histogram = context.label_histogram()
    for c in range(context.num_clients):
        idx = client_test_indices(context.test_split, histogram, y_test, c)
        if len(idx) and context.num_examples[c]:
            yield c, idx


def predictions(model: nn.Module, x: np.ndarray, batch_size: int) -> torch.Tensor:
    """The model's predicted classes for every row of `x` (eval mode, no grad)."""
    model.eval()
    with torch.no_grad():
        return torch.cat(
            [model(torch.as_tensor(x[i : i + batch_size])).argmax(1) for i in range(0, len(x), batch_size)]
        )


def client_logits(evaluator: Evaluator, variant: ModelConfig, weights: Weights, rows: np.ndarray) -> torch.Tensor:
    """Logits of a model on rows `rows` of the central test set (eval mode, no grad)."""
    model = evaluator.models.load(variant, weights)
    model.eval()
    b = evaluator.batch_size
    with torch.no_grad():
        return torch.cat([model(torch.as_tensor(evaluator.x_test[rows[i : i + b]])) for i in range(0, len(rows), b)])


def accuracy_stats(initial: Sequence[float], personal: Sequence[float]) -> dict[str, float]:
    """Mean and std over clients of initial and personalized accuracy: `initial_accuracy`,
    `personal_accuracy`, each with `_std`."""
    out = {}
    for name, xs in (("initial_accuracy", initial), ("personal_accuracy", personal)):
        out[name], out[f"{name}_std"] = (
            (float(np.mean(xs)), float(np.std(xs))) if len(xs) else (float("nan"), float("nan"))
        )
    return out


def features(model: nn.Module, x: np.ndarray, batch_size: int) -> torch.Tensor:
    """What the model's last linear layer receives, for every row of `x` (eval mode, no grad)."""
    head = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    out: list[torch.Tensor] = []
    hook = head.register_forward_pre_hook(lambda m, args: out.append(args[0].detach()) and None)
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(x), batch_size):
                model(torch.as_tensor(x[i : i + batch_size]))
    finally:
        hook.remove()
    return torch.cat(out) if out else torch.empty(0)


def personal_scores(
    model: nn.Module,
    clients: Clients,
    x_test: np.ndarray,
    y_test: np.ndarray,
    test_split: Sequence[np.ndarray] | None,
    *,
    seed: int,
    round: int,
    epochs: int,
    lr: float,
    batch_size: int,
) -> dict[str, float]:
    """`accuracy_stats` of the model and of it with its head fine-tuned per client; a client's
    fine-tuning batches are keyed by (seed, round, client, "personalize")."""
    head = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    test_features = features(model, x_test, 500)
    y = torch.as_tensor(y_test)
    histogram = clients.label_histogram()
    initial, personal = [], []
    for c in range(clients.num_clients):
        idx = client_test_indices(test_split, histogram, y_test, c)
        x_train, y_train = clients.train(c)
        if not len(idx) or not len(y_train):
            continue
        test_c, y_c = test_features[idx], y[idx]
        initial.append(float((head(test_c).argmax(1) == y_c).double().mean()))
        train_c, y_tc = features(model, x_train, 500), torch.as_tensor(y_train)
        w, b = head.weight.detach().clone().requires_grad_(), head.bias.detach().clone().requires_grad_()
        opt = torch.optim.SGD([w, b], lr=lr)
        g = rng.generator(seed, "personalize", round, c)
        for _ in range(epochs):
            for batch in epoch_batches(len(y_tc), batch_size, g):
                opt.zero_grad()
                F.cross_entropy(F.linear(train_c[batch], w, b), y_tc[batch]).backward()
                opt.step()
        with torch.no_grad():
            personal.append(float((F.linear(test_c, w, b).argmax(1) == y_c).double().mean()))
    return accuracy_stats(initial, personal)

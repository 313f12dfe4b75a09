"""Per-FedAvg: the FO and HF local steps on a tiny linear model, the one alpha-step of its
personalization, and a short run on shards."""

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.algorithms import registry
from rayfl.algorithms.perfedavg import outer_step
from rayfl.evaluate import Evaluator
from rayfl.load import load_config, parse_config
from rayfl.models import ModelCache
from rayfl.runner import run_local
from tests.algorithms.tiny import TinyClients, context, linear


def softmax(z):
    return np.exp(z - z.max()) / np.exp(z - z.max()).sum()


def grad(W, x, y):
    """grad_W of CE(softmax(W x), y) for logits W x (no bias): (softmax - e_y) x."""
    return (softmax(W * x) - np.eye(2)[y]) * x


def hessian(W, x):
    """d^2 CE / dW^2 for logits W x: x^2 (diag(p) - p p^T)."""
    p = softmax(W * x)
    return x**2 * (np.diag(p) - np.outer(p, p))


def step(variant, W, batches, alpha, beta):
    """`outer_step` of a 1 -> 2 linear model without bias (float64), from W; the new W and the loss."""
    model = torch.nn.Linear(1, 2, bias=False, dtype=torch.float64)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(W)[:, None])
    data = [
        (torch.tensor([[x]], dtype=torch.float64), torch.tensor([y])) for x, y in batches[: 3 if variant == "hf" else 2]
    ]
    loss = outer_step(model, torch.optim.SGD(model.parameters(), lr=beta), data, alpha, 1e-3)
    return model.weight.detach().numpy()[:, 0], loss


W = np.array([0.3, -0.2])
BATCHES = [(1.0, 0), (2.0, 1), (-1.5, 0)]  # D, D', D'': one sample (x, y) each
ALPHA, BETA = 0.5, 0.1


def test_fo_step_is_the_two_step_meta_update():
    new, loss = step("fo", W, BATCHES, ALPHA, BETA)
    (x, y), (x2, y2) = BATCHES[:2]
    temp = W - ALPHA * grad(W, x, y)  # w~ = w - alpha grad f(w; D)
    np.testing.assert_allclose(new, W - BETA * grad(temp, x2, y2), rtol=1e-12)  # w - beta grad f(w~; D')
    assert loss == pytest.approx(-np.log(softmax(temp * x2)[y2]), rel=1e-12)


def test_hf_step_adds_the_hessian_correction():
    (x, y), (x2, y2), (x3, _) = BATCHES
    u = grad(W - ALPHA * grad(W, x, y), x2, y2)  # grad f(w~; D')
    fo, _ = step("fo", W, BATCHES, ALPHA, BETA)
    hf, _ = step("hf", W, BATCHES, ALPHA, BETA)
    # w - beta (I - alpha H(w; D'')) u: HF moves beta alpha H u further than FO.
    correction = BETA * ALPHA * hessian(W, x3) @ u
    assert np.abs(correction).min() > 1e-3
    np.testing.assert_allclose(hf - fo, correction, rtol=1e-5)  # the central difference errs by O(delta^2)


def test_personalization_takes_exactly_one_alpha_step():
    # One client, one training sample (x = 1, class 1); a model with logits [1, 0] + W x, W = 0.
    alpha, c = 1.0, 1.0
    xs, ys = np.array([0.0, -0.35]), np.array([1, 0])  # its own test rows

    def sgd(Wb):
        W, b = Wb
        err = softmax(W + b) - np.eye(2)[1]
        return W - alpha * err, b - alpha * err

    def accuracy(Wb):
        W, b = Wb
        return float(np.mean([np.argmax(W * x + b) == y for x, y in zip(xs, ys)]))

    w0 = (np.zeros(2), np.array([c, 0.0]))
    assert [accuracy(w0), accuracy(sgd(w0)), accuracy(sgd(sgd(w0)))] == [0.5, 1.0, 0.5]  # only one step is right
    cfg = parse_config({"algorithm": {"name": "perfedavg", "alpha": alpha}, "model": {"name": "mlp", "hidden": []}})
    policy = registry.get("perfedavg").policy(cfg, context((1,), test_split=(np.array([0, 1]),)))
    evaluator = Evaluator(TinyClients(xs, ys, {0: ([1.0], [1])}), ModelCache((1,), 2), 100, 10)
    out = policy.personalize(policy.init_state(linear(*w0)), 1, evaluator)
    assert out["initial_accuracy"] == 0.5
    assert out["personal_accuracy"] == 1.0


def test_two_rounds_on_shards_report_finite_personal_accuracy(tmp_path):
    cfg = load_config(
        None,
        [
            "algorithm.name=perfedavg",
            "data.num_clients=5",
            "federation.clients_per_round=3",
            "federation.rounds=2",
            "data.partition.kind=shards",
            "federation.personalize_epochs=1",
        ],
    )
    run_local(cfg, tmp_path)
    metrics = pd.read_parquet(tmp_path / "metrics.parquet")
    assert len(metrics) == 2
    assert np.isfinite(metrics[["test_accuracy", "initial_accuracy", "personal_accuracy"]].to_numpy()).all()

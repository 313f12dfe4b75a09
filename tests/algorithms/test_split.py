"""Split-learning steps: the merged gradient is each worker's own mean-loss gradient; SFL per-worker steps."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rayfl.algorithms.split import bottom_step, merged_step, unmerged_steps


def test_merged_gradients_are_each_workers_own_mean_loss_gradient():
    torch.manual_seed(0)
    top = nn.Linear(3, 4)
    feats = [torch.randn(2, 3), torch.randn(6, 3)]  # d_1 = 2, d_2 = 6, D = 8
    labels = [torch.tensor([0, 1]), torch.tensor([2, 3, 0, 1, 2, 3])]
    # Before the step: the gradient of worker i's own mean loss w.r.t. its features.
    expected = []
    for f, y in zip(feats, labels):
        x = f.clone().requires_grad_(True)
        F.cross_entropy(top(x), y).backward()
        expected.append(x.grad)
    # By hand: one SGD step on the mean loss over all D = 8 merged samples.
    twin = nn.Linear(3, 4)
    twin.load_state_dict(top.state_dict())
    ref_loss = F.cross_entropy(twin(torch.cat(feats)), torch.cat(labels))
    ref_loss.backward()
    with torch.no_grad():
        want_w = twin.weight - 0.1 * twin.weight.grad
    loss, grads = merged_step(top, torch.optim.SGD(top.parameters(), lr=0.1), feats, labels)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)  # rescaled by D / d_i: 4x and 4/3x the merged pieces
    assert loss == pytest.approx(float(ref_loss.detach()))
    torch.testing.assert_close(top.weight.detach(), want_w)


def test_unmerged_steps_update_the_top_once_per_worker_in_order():
    torch.manual_seed(1)
    top = nn.Linear(3, 2, bias=False)
    twin = nn.Linear(3, 2, bias=False)
    twin.load_state_dict(top.state_dict())
    feats = [torch.randn(3, 3), torch.randn(4, 3)]
    labels = [torch.tensor([0, 1, 0]), torch.tensor([1, 1, 0, 1])]
    loss, grads = unmerged_steps(top, torch.optim.SGD(top.parameters(), lr=0.5), feats, labels)
    opt = torch.optim.SGD(twin.parameters(), lr=0.5)
    losses = []
    for f, y in zip(feats, labels):  # by hand: two sequential SGD steps
        opt.zero_grad()
        l = F.cross_entropy(twin(f), y)
        l.backward()
        opt.step()
        losses.append(float(l.detach()))
    torch.testing.assert_close(top.weight, twin.weight)
    assert loss == pytest.approx(losses) and [g.shape for g in grads] == [(3, 3), (4, 3)]


def test_bottom_step_applies_the_feature_gradient():
    bottom = nn.Linear(2, 3, bias=False)
    w0 = bottom.weight.detach().clone()
    x = torch.tensor([[1.0, 2.0]])
    out = bottom(x)
    grad = torch.tensor([[1.0, 0.0, -1.0]])
    bottom_step(torch.optim.SGD(bottom.parameters(), lr=0.1), out, grad)
    # d out / d W = grad^T x: W <- W - 0.1 * grad^T x
    torch.testing.assert_close(bottom.weight, w0 - 0.1 * grad.T @ x)


def test_unmerged_steps_use_each_workers_rate():
    torch.manual_seed(2)
    top, twin = nn.Linear(3, 2, bias=False), nn.Linear(3, 2, bias=False)
    twin.load_state_dict(top.state_dict())
    feats, labels = [torch.randn(2, 3), torch.randn(2, 3)], [torch.tensor([0, 1]), torch.tensor([1, 0])]
    unmerged_steps(top, torch.optim.SGD(top.parameters(), lr=9.0), feats, labels, lrs=[0.1, 0.3])
    for f, y, lr in zip(feats, labels, (0.1, 0.3)):  # by hand: two SGD steps at 0.1 then 0.3
        twin.zero_grad()
        F.cross_entropy(twin(f), y).backward()
        with torch.no_grad():
            twin.weight -= lr * twin.weight.grad
    torch.testing.assert_close(top.weight, twin.weight)


def test_top_server_dropout_is_keyed_by_seed_round_and_iteration():
    from rayfl.algorithms.split import TopServer
    from rayfl.optim import OptimizerSpec

    def run(seed):
        torch.manual_seed(0)
        top = nn.Sequential(nn.Dropout(0.5), nn.Linear(4, 2))
        server = TopServer(top, OptimizerSpec("sgd", 0.1), [0.1], merge=True, seed=seed, round=3)
        feats, labels = [torch.ones(8, 4)], [torch.zeros(8, dtype=torch.long)]
        torch.manual_seed(123)  # the caller's global RNG state must not matter
        return [server.step(feats, labels)[1][0] for _ in range(2)]

    a, b, c = run(0), run(0), run(1)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], a[1])  # a fresh mask each iteration
    assert not torch.equal(a[0], c[0])

"""Vectorized clients: K clients trained in one batched computation equal training them one by one."""

import numpy as np
import pytest

from rayfl.config import ConfigError
from rayfl.engine import build_federation, run_round, torch_threads
from rayfl.load import load_config
from rayfl.runner import InProcessExecutor

# Unequal client sizes (Dirichlet), two epochs, momentum, weight decay and clipping: clients run
# out of batches at different steps, so sitting steps out and per-client clipping both matter.
BASE = [
    "model.name=mlp",
    "data.num_clients=30",
    "federation.clients_per_round=10",
    "federation.local_epochs=2",
    "federation.momentum=0.9",
    "federation.weight_decay=0.001",
    "federation.grad_clip=0.5",
    "federation.lr=0.05",
]


def one_round(sets):
    cfg = load_config(None, sets)
    with torch_threads():
        fed = build_federation(cfg)
        state = fed.policy.init_state(fed.initial_weights())
        return run_round(fed, state, 1, InProcessExecutor(fed), 0.0)


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["algorithm.name=fedprox", "algorithm.mu=0.1"],
        ["federation.optimizer=adam", "federation.momentum=0", "federation.lr=0.005"],
        ["federation.grad_clip={kind: value, max: 0.01}"],
        # depth groups of a transformer: clients of one stack have different depths (one vmap group each)
        [
            "algorithm.name=inclusivefl",
            "model.name=transformer",
            "model.width=8",
            "model.heads=2",
            "model.ffn=8",
            "devices.profile=mobile",
        ],
        # width levels: clients of one width train together, each with its own label mask (-inf
        # takes absent classes out of the softmax, so a wrong client's mask changes the loss)
        [
            "algorithm.name=heterofl",
            "algorithm.levels=a1-c1",
            "algorithm.mask=-inf",
            "model.norm=none",
            "data.partition={kind: shards, classes_per_client: 2}",
        ],
    ],
    ids=["fedavg-sgd", "fedprox", "adam", "clip-by-value", "inclusivefl-transformer", "heterofl-masked"],
)
def test_vectorized_clients_equal_sequential_ones(extra):
    seq = one_round([*BASE, *extra])
    vec = one_round([*BASE, *extra, "ray.vectorize=5"])
    sizes = [r["num_samples"] for r in seq.clients]
    assert len(set(sizes)) > 3  # clients of unequal sizes
    assert [r["num_samples"] for r in vec.clients] == sizes
    assert [r["status"] for r in vec.clients] == ["ok"] * 10
    np.testing.assert_allclose(
        [r["train_loss"] for r in vec.clients], [r["train_loss"] for r in seq.clients], rtol=1e-4
    )
    fed = build_federation(load_config(None, [*BASE, *extra]))
    initial = fed.policy.init_state(fed.initial_weights()).weights
    for k, w in seq.state.weights.items():
        np.testing.assert_allclose(vec.state.weights[k], w, rtol=1e-4, atol=1e-5)
        assert not np.array_equal(w, initial[k])  # it trained


def test_a_diverging_client_fails_alike():
    seq, vec = (one_round([*BASE, "federation.lr=1e6", *extra]) for extra in ([], ["ray.vectorize=10"]))
    assert [(r["status"], r["reason"], r["num_samples"]) for r in vec.clients] == [
        (r["status"], r["reason"], r["num_samples"]) for r in seq.clients
    ]
    assert {r["status"] for r in vec.clients} == {"failed"}


@pytest.mark.parametrize(
    "sets, message",
    [
        (["algorithm.name=ditto"], "ray.vectorize: ditto trains its clients one at a time"),
        (["data.name=mnist1d", "model.name=cnn_s"], "ray.vectorize: model cnn_s has a batch norm that would take"),
        (["model.name=alexnet"], "ray.vectorize: model alexnet has dropout"),
        (["algorithm.name=sfl"], "ray.vectorize: sfl trains its clients one at a time"),
    ],
)
def test_what_cannot_be_vectorized_is_refused_before_a_run(sets, message):
    with pytest.raises(ConfigError) as err:
        build_federation(load_config(None, [*sets, "ray.vectorize=4"]))
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "extra",
    [
        ["model.name=cnn", "model.norm=bn", "model.rate=0.25"],
        ["model.name=preresnet18", "model.norm=bn", "model.rate=0.0625"],
        ["model.name=preresnet20", "model.norm=bn", "model.rate=0.25"],
        # HeteroFL's static BN: batch statistics in training, no running ones
        ["algorithm.name=heterofl", "algorithm.levels=a1-c1", "model.rate=0.25"],
    ],
    ids=["cnn-bn", "preresnet18-bn", "preresnet20-bn", "heterofl-sbn"],
)
def test_batch_norm_vectorizes_with_each_clients_statistics_over_its_real_rows(extra):
    # Clients of unequal sizes in batches of 16: short batches are padded, and batch norm must take
    # each client's statistics over its own real rows, as when it trains alone (running mean and
    # variance, and the count of batches, included: they are averaged as buffers).
    sets = [
        "data.num_clients=30",
        "federation.clients_per_round=6",
        "federation.batch_size=16",
        "federation.lr=0.01",
        *extra,
    ]
    seq, vec = one_round(sets), one_round([*sets, "ray.vectorize=6"])
    assert [r["num_samples"] for r in vec.clients] == [r["num_samples"] for r in seq.clients]
    assert any(r["num_samples"] % 16 for r in seq.clients)  # some client has a short, padded batch
    np.testing.assert_allclose(
        [r["train_loss"] for r in vec.clients], [r["train_loss"] for r in seq.clients], rtol=1e-4
    )
    for k, w in seq.state.weights.items():
        np.testing.assert_allclose(vec.state.weights[k], w, rtol=1e-4, atol=1e-5, err_msg=k)


def test_a_cnn_with_group_norm_vectorizes():
    # Group norm normalizes each sample: the zero-weight padding of short batches cannot leak in.
    sets = ["model.name=cnn", "model.norm=gn", "model.rate=0.0625", "federation.clients_per_round=4"]
    seq, vec = one_round(sets), one_round([*sets, "ray.vectorize=4"])
    for k, w in seq.state.weights.items():
        np.testing.assert_allclose(vec.state.weights[k], w, rtol=1e-4, atol=1e-5)


def test_stacked_parameters_take_the_layout_of_their_gradients():
    # A vmapped linear layer's weight gradient does not come in the stacked (K, out, in)
    # contiguous layout: the leaves take the gradient's layout (so AccumulateGrad keeps each
    # step's gradient instead of copying it), with the stacked values unchanged. An offset added
    # straight onto the output gets an expanded (stride-0) gradient from the probe's sum: its
    # leaf stays dense.
    import torch
    from torch import nn
    from torch.func import functional_call, vmap

    from rayfl.algorithms.vectorize import gradient_strides, laid_out

    class Offset(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.offset = nn.Linear(3, 2), nn.Parameter(torch.zeros(2))

        def forward(self, x):
            return self.linear(x) + self.offset

    model = Offset()
    stacked = {n: torch.stack([p.detach() + k for k in range(4)]) for n, p in model.named_parameters()}
    forward = vmap(lambda p, x: functional_call(model, p, (x,)))
    x = torch.randn(4, 5, 3)
    probe = {n: p.clone().requires_grad_(True) for n, p in stacked.items()}
    grads = dict(zip(probe, torch.autograd.grad(forward(probe, x).square().sum(), list(probe.values()))))
    assert grads["linear.weight"].stride() != stacked["linear.weight"].stride()

    leaves = laid_out(stacked, gradient_strides(stacked, lambda p: forward(p, torch.ones(4, 1, 3)).sum()))
    assert leaves["linear.weight"].stride() == grads["linear.weight"].stride()
    assert leaves["offset"].stride() == (2, 1)
    for n in stacked:
        assert leaves[n].is_leaf and leaves[n].requires_grad
        assert torch.equal(leaves[n], stacked[n])


@pytest.mark.parametrize(
    "sets, expected",
    [
        ([], 5),  # CPUs: the fixed groups every figure so far was measured with
        (["ray.gpus_per_actor=0.125"], 4),  # 32 a round over the 8 actors one GPU holds
        (["ray.gpus_per_actor=1"], 32),  # one actor per GPU takes the whole round in one call
        (["ray.gpus_per_actor=0.25", "ray.num_actors=2"], 16),
        (["ray.gpus_per_actor=0.25", "ray.clients_per_call=3"], 3),
    ],
)
def test_clients_per_call_auto_gives_a_gpu_actor_its_share_of_the_round(sets, expected):
    assert load_config(None, ["federation.clients_per_round=32", "data.num_clients=100", *sets]).call_size == expected


def test_vectorize_auto_fills_a_gpu_actors_memory_share_and_stays_sequential_elsewhere():
    from rayfl.engine.host import VECTORIZE_HEADROOM, vectorize_width

    fed = build_federation(
        load_config(None, ["model.name=mlp", "ray.gpus_per_actor=1", "federation.clients_per_round=10"])
    )
    each = fed.context.training_memory(fed.config.model)
    assert fed.vectorizable and fed.config.call_size == 10
    assert vectorize_width(fed, "cpu", None) == 1  # CPU actors and in-process runs train one at a time
    assert (
        vectorize_width(fed, "cuda", 3.5 * each / VECTORIZE_HEADROOM) == 3
    )  # three clients' training memory fit the share
    assert vectorize_width(fed, "cuda", 100 * each) == 10  # never wider than a call
    assert vectorize_width(fed, "cuda", 0.5 * each) == 1
    dropout = build_federation(load_config(None, ["model.name=alexnet", "ray.gpus_per_actor=1"]))  # cannot vectorize
    assert not dropout.vectorizable and vectorize_width(dropout, "cuda", 100 * each) == 1
    fixed = build_federation(load_config(None, ["model.name=mlp", "ray.vectorize=4"]))
    assert vectorize_width(fixed, "cpu", None) == 4

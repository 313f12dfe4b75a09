"""FedSup and E-FedSup (Kim & Yun): the sandwich sampler, in-place distillation, gradient
accumulation over the M sub-nets of a step, FLOPs-aware tiers, sub-net bytes and the two
aggregation rules, on hand numbers."""

import copy
import functools

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from rayfl.algorithms import aggregate
from rayfl.algorithms.fedsup import distill_loss, fill_finish, step_subnets
from rayfl.algorithms.messages import ClientResult
from rayfl.devices.cost import measure
from rayfl.engine import ClientRunner, build_federation, torch_threads
from rayfl.load import load_config
from rayfl.models import build_model
from rayfl.models.supernet import SupernetSmallConfig, largest, smallest
from rayfl.runner import run_local
from tests.algorithms.tiny import aggregated

SMALL = SupernetSmallConfig()
FEW = ["data.num_clients=6", "federation.clients_per_round=3", "federation.rounds=1"]


@pytest.mark.parametrize("m", [3, 4, 6])
def test_the_sandwich_always_holds_the_largest_and_the_smallest(m):
    for step in range(20):
        subnets = step_subnets(SMALL, 0, 1, 2, step, m, sandwich=True, distill=True)
        assert len(subnets) == m and subnets[0] == largest(SMALL) and subnets[-1] == smallest(SMALL)
    # Random sub-nets in between, drawn per (seed, round, client, step).
    middles = {step_subnets(SMALL, 0, 1, 2, step, m, True, True)[1] for step in range(20)}
    assert len(middles) > 1
    assert step_subnets(SMALL, 0, 1, 2, 5, m, True, True) == step_subnets(SMALL, 0, 1, 2, 5, m, True, True)


def test_without_the_sandwich_or_with_one_subnet_the_draws_are_random():
    one = [step_subnets(SMALL, 0, 1, 2, s, 1, True, True)[0] for s in range(10)]
    assert len(set(one)) > 1  # Alg. 1 l. 8: RandomSampleModel
    no_sandwich = [step_subnets(SMALL, 0, 1, 2, s, 3, False, True) for s in range(10)]
    assert all(x[0] == largest(SMALL) for x in no_sandwich)  # still the teacher
    assert any(x[-1] != smallest(SMALL) for x in no_sandwich)


def test_in_place_distillation_loss_on_hand_logits():
    z = torch.tensor([[1.0, 0.0, -1.0]])
    teacher = torch.tensor([[0.0, 2.0, 0.0]])
    p = np.exp([0.0, 2.0, 0.0]) / np.exp([0.0, 2.0, 0.0]).sum()
    log_q = np.array([1.0, 0.0, -1.0]) - np.log(np.exp([1.0, 0.0, -1.0]).sum())
    y = torch.tensor([2])
    assert float(distill_loss(z, teacher, y)) == pytest.approx(-(p * log_q).sum(), rel=1e-6)
    t = teacher.clone().requires_grad_()
    distill_loss(z.clone().requires_grad_(), t, y).backward()
    assert t.grad is None  # the teacher is detached
    # T = 2, lambda = 0.25: 0.25 * 4 * soft-CE at T + 0.75 * CE on the label 2
    p2 = np.exp([0.0, 1.0, 0.0]) / np.exp([0.0, 1.0, 0.0]).sum()
    log_q2 = np.array([0.5, 0.0, -0.5]) - np.log(np.exp([0.5, 0.0, -0.5]).sum())
    want = 0.25 * 4 * -(p2 * log_q2).sum() + 0.75 * -log_q[2]
    assert float(distill_loss(z, teacher, y, temperature=2.0, weight=0.25)) == pytest.approx(want, rel=1e-6)


def test_a_step_accumulates_the_gradients_of_its_subnets_then_steps_once():
    cfg = load_config(
        None,
        [
            "algorithm.name=fedsup",
            *FEW,
            "federation.batch_size=1000",
            "federation.lr=0.1",
            "algorithm.temperature=2",
            "algorithm.distill_weight=0.5",
        ],
    )
    with torch_threads():
        fed = build_federation(cfg)
        state = fed.policy.init_state(fed.initial_weights())
        task = fed.policy.configure(state, 1, [0])[0]
        out = ClientRunner.of(fed).run_all([task])[0]
        # By hand: one batch (the whole client), the step's three sub-nets, summed gradients, one SGD step.
        model = copy.deepcopy(fed.models.load(cfg.model, state.weights))
        model.train()
        x, y = (torch.from_numpy(a) for a in fed.clients.train(0))
        subnets = step_subnets(cfg.model, cfg.seed, 1, 0, 0, 3, True, True)
        model.set_active(subnets[0])
        teacher = model(x)
        loss = F.cross_entropy(teacher, y)
        for s in subnets[1:]:
            model.set_active(s)
            loss = loss + distill_loss(model(x), teacher, y, temperature=2.0, weight=0.5)
        grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    for (name, p), g in zip(model.named_parameters(), grads):
        want = p.detach() - 0.1 * g if g is not None else p.detach()
        np.testing.assert_allclose(out.weights[name], want.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def efedsup(*extra):
    cfg = load_config(None, ["algorithm.name=efedsup", "devices.profile=mobile", *FEW, *extra])
    with torch_threads():
        fed = build_federation(cfg)
        return fed, fed.policy.init_state(fed.initial_weights())


def static_cost(subnet, fed):
    """A sub-net's cost measured on its whole static model (`measure`), not as the policy sums it."""
    return measure(
        build_model(subnet.config(SMALL), fed.context.input_shape, fed.context.num_classes), fed.context.input_shape
    )


@pytest.mark.parametrize("budget", ["flops", "params"])
def test_tiers_draw_subnets_that_fit_their_budget(budget):
    """Sec. 3.4: a tier's budget bounds inference FLOPs (Table 6), the public code's parameters.
    The weakest tier (mobile: weak) gets the smallest's share, the strongest the whole; every
    drawn sub-net fits its tier by the static model's own count, and the draws bind (some fall
    back to the smallest, some are larger)."""
    fed, _ = efedsup("data.num_clients=60", f"algorithm.budget={budget}")
    size = functools.cache(  # each sub-net built and measured once
        (lambda s: static_cost(s, fed).forward_flops)
        if budget == "flops"
        else (lambda s: static_cost(s, fed).num_params)
    )
    big = size(largest(SMALL))
    assert fed.policy.budgets[0] == pytest.approx(size(smallest(SMALL)) / big) and fed.policy.budgets[-1] == 1.0
    drawn = {c: fed.policy.tier_subnet(1, c) for c in range(60)}
    for c, s in drawn.items():
        assert size(s) <= fed.policy.budgets[fed.context.device_classes[c]] * big * (1 + 1e-9), (c, s)
    assert {s for c, s in drawn.items() if fed.context.device_classes[c] == 0} == {smallest(SMALL)}
    assert len(set(drawn.values())) > 10


def test_one_device_class_draws_from_the_whole_space_not_the_smallest_only():
    fed, _ = efedsup("devices.profile=uniform")
    assert fed.policy.budgets == [1.0]  # evenly from the smallest's share to 1 would give [smallest's share]
    assert len({fed.policy.tier_subnet(1, c) for c in range(6)}) > 1


ONE_NET = ["model.widths=[[16],[32],[64],[256]]", "model.depths=[[1],[2],[2],[2]]", "model.kernels=[[7],[7],[7],[7]]"]
"""supernet_small's space cut to one net, its largest."""


def test_with_one_net_in_the_space_efedsup_is_fedsup_with_one_subnet_a_step(tmp_path):
    """The degenerate case where the two must compute the same model: every client trains the
    one net on labels (FedSup's M = 1 draws it every step with no distillation; every E-FedSup
    tier fits it and only it travels); whole-supernet averaging and `fill` agree when every
    client holds every entry."""
    few = ["data.num_clients=6", "federation.clients_per_round=3", "federation.rounds=2", "devices.profile=mobile"]
    run_local(load_config(None, ["algorithm.name=fedsup", "algorithm.subnets=1", *few, *ONE_NET]), tmp_path / "fedsup")
    run_local(load_config(None, ["algorithm.name=efedsup", *few, *ONE_NET]), tmp_path / "efedsup")
    learned = ["train_loss", "test_loss", "test_accuracy"]
    fedsup, efedsup_ = (pd.read_parquet(tmp_path / name / "metrics.parquet")[learned] for name in ("fedsup", "efedsup"))
    pd.testing.assert_frame_equal(fedsup, efedsup_, check_exact=True)


def test_only_the_subnet_travels(tmp_path):
    run_local(load_config(None, ["algorithm.name=efedsup", "devices.profile=mobile", *FEW]), tmp_path)
    clients = pd.read_parquet(tmp_path / "clients.parquet")
    fed, state = efedsup()
    for _, row in clients.iterrows():
        sub = fed.policy.tier_subnet(1, int(row.client_id))
        size = sum(np.prod(shape) * 4 for shape in fed.policy.sub_shapes(sub).values())
        assert row.bytes_down == row.bytes_up == size
    assert clients.bytes_down.nunique() > 1  # tiers of different sizes


def test_fill_and_count_aggregation_on_hand_tensors():
    old = {"w": np.ones((5,), np.float32)}  # the broadcast values
    # Client a (weight 1) trained entries 0..1 to 2.0; client b (weight 3) entries 0..3 to 4.0;
    # nobody trained entry 4.
    parts = [
        {**aggregate.count_sum({"w": (5,)}, {"w": np.full(2, 2.0)}, None, 1.0), aggregate.WEIGHT: np.array(1.0)},
        {**aggregate.count_sum({"w": (5,)}, {"w": np.full(4, 4.0)}, None, 3.0), aggregate.WEIGHT: np.array(3.0)},
    ]
    total = aggregate.add_up(parts)
    # Fill (the paper): a's untrained entries count as the broadcast 1: (1 * 2 + 3 * 4) / 4,
    # then (1 * 1 + 3 * 4) / 4; the untrained entry keeps its value.
    assert fill_finish(old, total)["w"].tolist() == [3.5, 3.5, 3.25, 3.25, 1.0]
    # Count: each entry over its holders: (2 + 12) / 4, then 12 / 3.
    assert aggregate.count_finish(old, total)["w"].tolist() == [3.5, 3.5, 4.0, 4.0, 1.0]


def test_fedsup_averages_whole_supernets_by_samples():
    cfg = load_config(None, ["algorithm.name=fedsup", *FEW])
    fed = build_federation(cfg)
    state = fed.policy.init_state(fed.initial_weights())
    ones = {k: np.ones_like(v) for k, v in state.weights.items()}
    threes = {k: np.full_like(v, 3.0) for k, v in state.weights.items()}
    new = aggregated(
        fed.policy,
        state,
        1,
        [
            ClientResult(client_id=0, round=1, weights=ones, num_examples=10, num_samples=10, train_loss=0.0),
            ClientResult(client_id=1, round=1, weights=threes, num_examples=30, num_samples=30, train_loss=0.0),
        ],
    ).weights
    assert all(np.allclose(v, 2.5) for v in new.values())

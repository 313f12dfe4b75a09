"""FeDepth and m-FeDepth (Zhang et al. 2023): the memory-adaptive decomposition against the paper's
Fig. 3 and the public code's hand-written PreResNet-20 schedules, depth-wise training with frozen
blocks, the skip links, per-trainer aggregation of heads and skipped layers, and mutual knowledge
distillation with persistent per-client peers."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rayfl.algorithms.fedepth import FeDepthTask, Stage, decompose, mkd_loss
from rayfl.algorithms.messages import ClientResult
from rayfl.config import ConfigError
from rayfl.devices.cost import measure
from rayfl.engine import ClientRunner, build_federation, run_round, torch_threads
from rayfl.engine.federation import width_memory
from rayfl.load import load_config
from rayfl.models import build_model, to_numpy
from rayfl.models.preresnet20 import PreResNet20Config, link
from rayfl.runner import InProcessExecutor
from tests.algorithms.tiny import aggregated

BIG_BATCH = ["federation.batch_size=128", "data.num_clients=8", "federation.clients_per_round=4"]


def test_decompose_reproduces_fig_3():
    costs = [3, 2, 1, 0.5, 0.5, 0.5]  # GB
    assert decompose(costs, 3) == [[0], [1, 2], [3, 4, 5]]
    assert decompose(costs, 5) == [[0, 1], [2, 3, 4, 5]]
    assert decompose(costs, 8) == [[0, 1, 2, 3, 4, 5]]
    with pytest.raises(ConfigError, match="layer 0 alone"):
        decompose(costs, 2.5)


def test_the_public_codes_preresnet20_schedules_come_out_of_measured_memory():
    # CIFAR-size inputs, batch 128, SGD with momentum 0.9 (example.sh): each budget is the measured
    # memory of training the r-width network; the partitioner must give the code's hand-written plans.
    shape = (3, 32, 32)
    cfg = load_config(None, ["algorithm.name=fedepth", "federation.batch_size=128", "federation.momentum=0.9"])
    cost_of = lambda v: measure(build_model(v, shape, 10), shape)
    training_memory = lambda v: cost_of(v).training_memory(128, 1)  #  (batch 128, SGD with momentum)
    from rayfl.algorithms.fedepth import measure_layers, plan

    costs = measure_layers(build_model(cfg.model, shape, 10), shape)
    schedules = {}
    for r in (1 / 8, 1 / 6, 1 / 3, 1 / 2, 1.0):
        p = plan(
            costs,
            width_memory(cfg, training_memory, r),
            128,
            1,
            [costs.head],
            num_examples=400,
            memory="blocks",
            cache="never",
            mkd=2,
        )
        schedules[r] = [[i + 1 for i in b] for b in p.blocks]  # 1-based layers, as the code names them
    assert schedules[1 / 6] == [[1], [2], [3], [4], [5, 6], [7, 8, 9]]
    assert schedules[1 / 3] == [[1, 2], [3, 4], [5, 6, 7, 8, 9]]
    assert schedules[1 / 2] == [[1, 2, 3], [4, 5, 6, 7, 8, 9]]
    assert schedules[1.0] == [list(range(1, 10))]
    # Lack's 1/8 clients skip layers 1-3: the code's insufficient schedule {4} {5} {6} {7, 8} {9}.
    assert schedules[1 / 8] == [[4], [5], [6], [7, 8], [9]]
    # The parts add up to the whole model's measured activations (one attribution, no double count).
    whole = cost_of(cfg.model).activation_bytes
    assert costs.stem.saved_bytes + sum(c.saved_bytes for c in costs.layers) + costs.head.saved_bytes == whole


def test_stage_accounting_leaves_the_sixth_width_short_of_the_first_block():
    # Counting all a stage holds (stem, head, every weight), the 1/6 budget cannot train layer 1:
    # its clients skip layers (the finding the doc page reports).
    shape = (3, 32, 32)
    cfg = load_config(None, ["algorithm.name=fedepth", "federation.batch_size=128", "federation.momentum=0.9"])
    from rayfl.algorithms.fedepth import measure_layers, plan

    costs = measure_layers(build_model(cfg.model, shape, 10), shape)
    budget = width_memory(cfg, lambda v: measure(build_model(v, shape, 10), shape).training_memory(128, 1), 1 / 6)
    p = plan(costs, budget, 128, 1, [costs.head], num_examples=400, memory="stage", cache="never", mkd=2)
    assert p.skip > 0


def test_link_subsamples_and_centres_the_channels():
    z = torch.arange(2 * 16 * 32 * 32, dtype=torch.float32).reshape(2, 16, 32, 32)
    out = link(z, (64, 8, 8))
    assert out.shape == (2, 64, 8, 8)
    assert torch.equal(out[:, 24:40], z[:, :, ::4, ::4])  # link1: real channels 24..39
    assert not out[:, :24].any() and not out[:, 40:].any()
    z = torch.ones(1, 32, 16, 16)
    assert torch.equal(link(z, (64, 8, 8))[0, :, 0, 0], torch.tensor([0.0] * 16 + [1.0] * 32 + [0.0] * 16))  # link2
    z = torch.ones(1, 6, 20)  # odd padding on sequences: floor before, the rest after
    assert link(z, (11, 10))[0, :, 0].tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0]


def test_mkd_loss_against_a_hand_computed_value():
    z = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 1.0]])
    peer = torch.tensor([[0.5, 0.5, 2.0], [1.0, 0.0, 0.0]])
    y = torch.tensor([1, 2])
    sm = lambda a: np.exp(a) / np.exp(a).sum(1, keepdims=True)
    p, q = sm(z.numpy()), sm(peer.numpy())
    ce = -np.mean(np.log(p[[0, 1], [1, 2]]))
    kl = np.mean(np.sum(q * (np.log(q) - np.log(p)), 1))  # KL(peer || self), batch mean
    assert float(mkd_loss(z, [peer], y, 0.7)) == pytest.approx(ce + 0.7 * kl, rel=1e-6)
    assert float(mkd_loss(z, [peer, peer], y, 0.7)) == pytest.approx(ce + 0.7 * kl, rel=1e-6)  # lambda / (M - 1)
    zg = z.clone().requires_grad_()
    pg = peer.clone().requires_grad_()
    mkd_loss(zg, [pg], y, 1.0).backward()
    assert pg.grad is None  # the peer is detached


def federation(*overrides):
    with torch_threads():
        fed = build_federation(load_config(None, [*overrides]))
        return fed, fed.policy.init_state(fed.initial_weights())


def task_for(fed, state, client, **fields):
    return fed.policy.task(client, 1, state.weights, kind=FeDepthTask, model=fed.policy.variant, **fields)


def test_frozen_blocks_stay_bit_identical_through_later_stages():
    fed, state = federation(
        "algorithm.name=fedepth", *BIG_BATCH, "federation.momentum=0.9", "federation.weight_decay=5e-4"
    )
    runner = ClientRunner.of(fed)
    first = runner.run_all([task_for(fed, state, 0, blocks=((0, 1, 2),))])[0]
    both = runner.run_all([task_for(fed, state, 0, blocks=((0, 1, 2), tuple(range(3, 9))))])[0]
    early = [k for k in first.weights if k.startswith(("stem.", "layers.0.", "layers.1.", "layers.2."))]
    assert early and all(np.array_equal(first.weights[k], both.weights[k]) for k in early)
    assert not np.array_equal(first.weights["layers.5.conv1.weight"], both.weights["layers.5.conv1.weight"])
    # The public code under PyTorch 1.7: momentum and weight decay keep moving the frozen block.
    drift = runner.run_all([task_for(fed, state, 0, blocks=((0, 1, 2), tuple(range(3, 9))), drift=True)])[0]
    assert not np.array_equal(first.weights["layers.1.conv1.weight"], drift.weights["layers.1.conv1.weight"])


def run_stage(model, task, j, block, data, ctx):
    """Stage j's steps over its seeded batches; its summed loss (x batch size) and samples."""
    stage, loss_sum, samples = Stage(model, task, j, block, data, ctx), 0.0, 0
    for b in ctx.batches(task, data, purpose=f"stage-{j}"):
        loss_sum += float(stage.step(b)) * b.size
        samples += b.size
    return loss_sum, samples


def test_a_stage_trains_its_block_and_head_on_the_frozen_prefix():
    # Problem (1), stage j = 1 of blocks {0, 1, 2} {3, 4, 5}: only layers 3-5 and the head move
    # (the stem trains with the first block only, later layers wait for their stage); the stage
    # runs the task's epochs over the client's samples, and its loss is their weighted sum.
    fed, state = federation(
        "algorithm.name=fedepth", *BIG_BATCH, "federation.local_epochs=2", "federation.momentum=0.9"
    )
    runner = ClientRunner.of(fed)
    task = task_for(fed, state, 0, blocks=((0, 1, 2), (3, 4, 5)))
    data = runner.data(0)
    model = runner.context.load(task.model, task.weights)
    before = to_numpy(model)
    with torch_threads():
        loss_sum, samples = run_stage(model, task, 1, (3, 4, 5), data, runner.context)
    after = to_numpy(model)
    moved = {
        k.split(".")[0] + ("." + k.split(".")[1] if k.startswith("layers.") else "")
        for k in before
        if not np.array_equal(before[k], after[k])
    }
    assert moved == {"layers.3", "layers.4", "layers.5", "head"}
    assert samples == 2 * len(data) and 0 < loss_sum / samples < 10


def test_an_m_fedepth_stage_trains_its_block_and_the_auxiliary_classifier_it_ends_at():
    # m-FeDepth: stage j = 1 of blocks {0, 1, 2} {3, 4, 5} {6, 7, 8} exits through the auxiliary
    # classifier after layer 5 and trains it with layers 3-5; the last stage trains the head.
    fed, state = federation("algorithm.name=mfedepth", *BIG_BATCH)
    runner = ClientRunner.of(fed)
    blocks = ((0, 1, 2), (3, 4, 5), (6, 7, 8))
    task = task_for(fed, state, 0, blocks=blocks, aux=True)
    data = runner.data(0)
    for j, want in (
        (1, {"layers.3", "layers.4", "layers.5", "aux.5"}),
        (2, {"layers.6", "layers.7", "layers.8", "head"}),
    ):
        model = runner.context.load(task.model, task.weights)
        before = to_numpy(model)
        with torch_threads():
            run_stage(model, task, j, blocks[j], data, runner.context)
        after = to_numpy(model)
        assert {
            ".".join(k.split(".")[:2]) if k.startswith(("layers.", "aux.")) else k.split(".")[0]
            for k in before
            if not np.array_equal(before[k], after[k])
        } == want


def test_a_cached_prefix_trains_as_the_recomputed_one():
    # Group norm makes the prefix per sample, so the cache changes nothing but the compute.
    fed, state = federation("algorithm.name=fedepth", *BIG_BATCH, "model.norm=gn", "federation.batch_size=16")
    runner = ClientRunner.of(fed)
    blocks = ((0, 1, 2), (3, 4, 5), (6, 7, 8))
    cached = runner.run_all([task_for(fed, state, 1, blocks=blocks, cache=True)])[0]
    again = runner.run_all([task_for(fed, state, 1, blocks=blocks)])[0]
    for k in cached.weights:
        np.testing.assert_allclose(cached.weights[k], again.weights[k], rtol=1e-4, atol=1e-6)


def test_client_cost_counts_the_frozen_prefix_of_every_stage():
    fed, state = federation("algorithm.name=fedepth", *BIG_BATCH)
    policy, c = fed.policy, fed.policy.costs
    blocks = ((0, 1, 2), tuple(range(3, 9)))
    result = ClientResult(
        client_id=0, round=1, weights=state.weights, num_examples=50, num_samples=200, train_loss=0.0
    )  # 100 samples per stage
    flops, down, up = policy.client_cost(task_for(fed, state, 0, blocks=blocks), result)
    stage1 = c.stem.train_flops + sum(l.train_flops for l in c.layers[:3]) + c.head.train_flops
    stage2 = (
        c.stem.forward_flops
        + sum(l.forward_flops for l in c.layers[:3])
        + sum(l.train_flops for l in c.layers[3:])
        + c.head.train_flops
    )
    assert flops == pytest.approx(100 * (stage1 + stage2))
    # Cached: the prefix runs once per example (50), not once per training sample (100).
    cached, _, _ = policy.client_cost(task_for(fed, state, 0, blocks=blocks, cache=True), result)
    assert flops - cached == pytest.approx(50 * (c.stem.forward_flops + sum(l.forward_flops for l in c.layers[:3])))
    assert down == up == sum(v.nbytes for v in state.weights.values())


def constant(weights, value):
    return {k: np.full_like(v, value) for k, v in weights.items()}


def test_m_fedepth_averages_each_head_over_the_clients_that_trained_it():
    fed, state = federation("algorithm.name=mfedepth", "devices.profile=fedepth_fair", *BIG_BATCH)
    policy = fed.policy
    plans = {c: policy.plan_of(c) for c in range(8)}
    small = next(c for c, p in plans.items() if len(p.blocks) > 3)
    full = next(c for c, p in plans.items() if len(p.blocks) == 1)
    ends = {b[-1] for b in plans[small].blocks[:-1]}
    results = [
        ClientResult(
            client_id=small,
            round=1,
            weights=constant(state.weights, 1.0),
            num_examples=10,
            num_samples=10,
            train_loss=0.0,
        ),
        ClientResult(
            client_id=full,
            round=1,
            weights=constant(state.weights, 3.0),
            num_examples=30,
            num_samples=30,
            train_loss=0.0,
        ),
    ]
    new = aggregated(policy, state, 1, results).weights
    assert new["layers.4.conv1.weight"].flat[0] == pytest.approx(2.5)  # the body: both, (10 * 1 + 30 * 3) / 40
    assert new["head.linear.weight"].flat[0] == pytest.approx(2.5)
    for i in range(8):
        w = new[f"aux.{i}.linear.weight"]
        if i in ends:
            assert np.all(w == 1.0)  # only the small client ended a block there
        else:
            np.testing.assert_array_equal(w, state.weights[f"aux.{i}.linear.weight"])  # nobody: kept


def test_partial_clients_leave_their_skipped_layers_to_the_others():
    fed, state = federation("algorithm.name=fedepth", "devices.profile=fedepth_lack", *BIG_BATCH)
    plans = {c: fed.policy.plan_of(c) for c in range(8)}
    partial = next(c for c, p in plans.items() if p.skip > 0)
    other = next(c for c, p in plans.items() if p.skip == 0)
    results = sorted(
        [
            ClientResult(
                client_id=partial,
                round=1,
                weights=constant(state.weights, 1.0),
                num_examples=10,
                num_samples=10,
                train_loss=0.0,
            ),
            ClientResult(
                client_id=other,
                round=1,
                weights=constant(state.weights, 3.0),
                num_examples=30,
                num_samples=30,
                train_loss=0.0,
            ),
        ],
        key=lambda r: r.client_id,
    )
    new = aggregated(fed.policy, state, 1, results).weights
    assert np.all(new["layers.0.conv1.weight"] == 3.0)  # skipped by the partial client
    assert new[f"layers.{plans[partial].skip}.conv1.weight"].flat[0] == pytest.approx(2.5)
    assert new["stem.conv.weight"].flat[0] == pytest.approx(2.5)  # the stem trains with the first block


def mkd_clients(fed, state, rnd):
    tasks = fed.policy.configure(
        state,
        rnd,
        fed.policy.select(
            state, rnd, fed.population.available(rnd, 0.0), fed.policy.config.federation.clients_per_round
        ),
    )
    return {t.client_id: t for t in tasks if t.peers}


@pytest.mark.parametrize("peers", ["per_client", "shared"])
def test_mkd_peers_persist_per_client_across_rounds(peers):
    fed, state = federation(
        "algorithm.name=fedepth",
        "devices.profile=fedepth_surplus",
        *BIG_BATCH,
        "federation.clients_per_round=8",
        f"algorithm.peers={peers}",
    )
    initial = state.clients["initial"]
    with torch_threads():
        tasks = mkd_clients(fed, state, 1)
        assert tasks and all(len(t.peers) == 1 and t.peers[0] is initial for t in tasks.values())
        state = run_round(fed, state, 1, InProcessExecutor(fed), 0.0).state
    again = mkd_clients(fed, state, 2)
    assert set(again) == set(tasks)
    for c, t in again.items():
        kept = state.clients[c if peers == "per_client" else "shared"][0]
        assert t.peers[0] is kept and not np.array_equal(
            kept["layers.0.conv1.weight"], initial["layers.0.conv1.weight"]
        )
    if peers == "per_client" and len(again) > 1:
        a, b = sorted(again)[:2]
        assert not np.array_equal(again[a].peers[0]["head.linear.weight"], again[b].peers[0]["head.linear.weight"])
    # Only the global model is uploaded: the peer stays on the device.
    assert all(set(t.weights) == set(state.weights) for t in again.values())


def test_mm_fedepth_refuses_aux_heads_that_miss_a_block_end():
    with pytest.raises(ConfigError, match="model.aux_heads"):
        federation("algorithm.name=mfedepth", "devices.profile=fedepth_fair", *BIG_BATCH, "model.aux_heads=9")


def test_clients_whose_budget_fits_no_layer_never_take_part():
    # Batch 10 on digits: the 1/6-width budget is smaller than training the last layer alone.
    fed, state = federation(
        "algorithm.name=fedepth", "devices.profile=fedepth_fair", "data.num_clients=8", "federation.clients_per_round=8"
    )
    out = fed.policy.select(state, 1, range(8), fed.policy.config.federation.clients_per_round)
    assert 0 < len(out) < 8 and all(fed.policy.fits[c] for c in out)
    assert fed.policy.summary()["clients_without_plan"] == 8 - len(out)


def test_cross_entropy_of_the_skip_exit_uses_the_shared_head():
    model = build_model(PreResNet20Config(aux_heads="2"), (1, 8, 8), 10)
    z = torch.randn(3, 16, 8, 8)
    assert torch.equal(model.exit(z, 1, aux=False), model.head(link(z, model.shapes[-1])))
    assert torch.equal(model.exit(z, 1, aux=True), model.aux["1"](z))
    assert F.cross_entropy(model.exit(z, 1), torch.zeros(3, dtype=torch.long)).isfinite()


def test_depthwise_fine_tuning_of_a_pretrained_transformer(tmp_path):
    # FeDepth's ViT experiment: an encoder whose blocks all have one shape; the stem (embedding and
    # position) trains with the first block, the skip to the head is the identity.
    pretrained = build_model(load_config(None, ["model.name=transformer"]).model, (1, 8, 8), 10).state_dict()
    pretrained = {k: torch.full_like(v, 0.01) if k.startswith("layers.") else v for k, v in pretrained.items()}
    pretrained["head.fc.weight"] = torch.zeros(3, 64)  # another task's head: not taken
    torch.save(pretrained, tmp_path / "vit.pt")
    fed, state = federation(
        "algorithm.name=fedepth", "model.name=transformer", f"model.init_weights={tmp_path / 'vit.pt'}", *BIG_BATCH
    )
    assert np.all(state.weights["layers.3.ff1.weight"] == np.float32(0.01))
    assert state.weights["head.fc.weight"].shape == (10, 64) and state.weights["head.fc.weight"].any()
    runner = ClientRunner.of(fed)
    one = runner.run_all([task_for(fed, state, 0, blocks=((0, 1, 2),))])[0]
    two = runner.run_all([task_for(fed, state, 0, blocks=((0, 1, 2), (3, 4, 5)))])[0]
    assert not np.array_equal(one.weights["position"], state.weights["position"])  # the stem trained in stage 1
    for k in ("position", "embed.weight", "layers.1.attn.q"):
        assert np.array_equal(one.weights[k], two.weights[k])  # frozen through stage 2
    with pytest.raises(ConfigError, match="model.init_weights"):
        load_config(None, ["model.name=transformer", f"model.init_weights={tmp_path / 'missing.pt'}"])
    with pytest.raises(ConfigError, match="mfedepth trains preresnet20"):
        load_config(None, ["algorithm.name=mfedepth", "model.name=transformer"])

"""HeteroFL's static-BN calibration: running statistics are the cumulative average over the given batches."""

import numpy as np
import torch

from rayfl.algorithms.heterofl import static_bn
from rayfl.data import Dataset, Partitioned
from rayfl.evaluate import Evaluator
from rayfl.models import ModelCache, build_model
from rayfl.models.mlp import MlpConfig


def test_sbn_calibration_is_the_equal_weight_average_of_batch_statistics():
    g = np.random.default_rng(0)
    x = g.normal(size=(7, 3)).astype(np.float32)
    ds = Dataset("toy", x, np.zeros(7, np.int64), x[:2], np.zeros(2, np.int64), 2)
    variant = MlpConfig(hidden=(4,), norm="sbn")
    torch.manual_seed(0)
    weights = {k: v.numpy() for k, v in build_model(variant, (3,), 2).state_dict().items()}
    assert not any("running" in k for k in weights)  # sBN trains without running statistics
    evaluator = Evaluator(Partitioned(ds, [np.arange(7)]), ModelCache((3,), 2), batch_size=2, eval_clients=1)
    batches = [np.array([0, 1, 2]), np.array([3, 4]), np.array([5, 6])]
    calibrated = static_bn(evaluator.models, variant, weights, [x[b] for b in batches])
    assert calibrated is evaluator.models.load(
        variant.model_copy(update={"norm": "bn", "scaler": 1.0}), weights, strict=False
    )
    bn = [m for m in calibrated.modules() if isinstance(m, torch.nn.BatchNorm1d)][0]
    h = x @ weights["1.weight"].T + weights["1.bias"]  # the BN input: the first linear layer
    means = [h[b].mean(0) for b in batches]
    variances = [h[b].var(0, ddof=1) for b in batches]  # BN keeps the unbiased batch variance
    np.testing.assert_allclose(bn.running_mean.numpy(), np.mean(means, 0), rtol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(), np.mean(variances, 0), rtol=1e-5)
    assert int(bn.num_batches_tracked) == 3

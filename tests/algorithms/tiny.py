"""Hand-sized stand-ins shared by the algorithms' tests: a federation context, a 1-d two-class
problem's clients and the weights of a linear model on it (the personalized baselines), and a
policy's aggregation of results in hand as the engine calls it."""

import numpy as np

from rayfl.algorithms.aggregate import add_up
from rayfl.algorithms.capabilities import Sums
from rayfl.algorithms.messages import FederationContext


def aggregated(policy, state, rnd, results):
    """`policy.aggregate` as the engine calls it: for a policy whose aggregate is a sum, the
    results' summands added up in order and the results without their weights; otherwise the
    results as they are and an empty total."""
    if not isinstance(policy, Sums):
        return policy.aggregate(state, rnd, results, {})
    return policy.aggregate(
        state, rnd, [r.replace(weights={}) for r in results], add_up(policy.summand(r) for r in results)
    )


def context(num_examples=(10, 30, 5), test_split=None, cost_of=None):
    n = len(num_examples)
    return FederationContext(
        0,
        n,
        2,
        (1,),
        np.array(num_examples),
        lambda: np.ones((n, 2)),
        frozenset({"w"}),
        np.full(n, 2**30),
        test_split,
        cost_of=cost_of,
    )


class TinyClients:
    """Clients of a 1-d, 2-class problem: a central test set and each client's training samples."""

    num_classes, input_shape = 2, (1,)

    def __init__(self, x_test, y_test, train):
        self.x_test, self.y_test, self.trains = np.array(x_test, np.float32)[:, None], np.array(y_test), train
        self.num_clients = len(train)

    def test_set(self, eval_clients):
        return self.x_test, self.y_test

    def train(self, c):
        x, y = self.trains[c]
        return np.array(x, np.float32)[:, None], np.array(y)


def linear(w1, b):
    """mlp(hidden=[]) weights: logits = [w1[0] x + b[0], w1[1] x + b[1]]."""
    return {"1.weight": np.array(w1, np.float32)[:, None], "1.bias": np.array(b, np.float32)}

"""`budget.fitting_rate`: the widest width rate whose training memory fits a budget, on a hand
memory curve and on a measured model."""

from types import SimpleNamespace

import pytest

from rayfl.algorithms.budget import RATE_TOL, fitting_rate
from rayfl.engine import build_federation, torch_threads
from rayfl.load import load_config

CFG = load_config(None, ["algorithm.name=heterofl"])


def hand_context():
    """Training memory of rate r: 1000 + 9000 r^2 bytes (a fixed part and a part quadratic in width)."""
    return SimpleNamespace(training_memory=lambda model: 1000 + 9000 * model.rate**2)


@pytest.mark.parametrize(
    "budget, rate",
    [
        (10_000, 1.0),  # the full model fits exactly
        (1e9, 1.0),
        (3_250, 0.5),  # 1000 + 9000 r^2 = 3250: r = 0.5
        (1_090, 0.1),
    ],
)
def test_the_fitting_rate_of_a_hand_memory_curve(budget, rate):
    r = fitting_rate(CFG, hand_context(), budget)
    assert r == pytest.approx(rate, abs=RATE_TOL)
    assert 1000 + 9000 * r**2 <= budget  # it fits: the bisection keeps its lower end


def test_a_budget_that_fits_not_even_the_thinnest_model_gives_rate_zero():
    """A client below 1000 bytes fits nothing: rate exactly 0, not a tiny width that would put it
    into HeteroFL's budget mode or SplitMix's bases."""
    assert fitting_rate(CFG, hand_context(), 999.0) == 0.0


def test_the_fitting_rate_of_a_measured_model_brackets_the_budget():
    with torch_threads():
        fed = build_federation(CFG)
    need = lambda r: fed.context.training_memory(CFG.model.model_copy(update={"rate": r}))
    budget = (need(0.3) + need(0.6)) / 2
    r = fitting_rate(CFG, fed.context, budget)
    assert 0.3 <= r < 0.6 and need(r) <= budget < need(r + RATE_TOL)

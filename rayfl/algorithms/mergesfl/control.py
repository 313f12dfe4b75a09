"""MergeSFL's control module (Alg. 1) as pure functions.

"MergeSFL: Split Federated Learning with Feature Merging and Batch Size Regulation", Yunming
Liao, Yang Xu, Hongli Xu, Lun Wang, Zhiwei Yao, Chunming Qiao, ICDE 2024 (arXiv:2311.13348).
The public code has no control module (docs/papers.md, MergeSFL: public code, no control
module), so the paper's equations are the specification. Symbols: mu_i per-sample compute
time, beta_i per-sample transmission time, d_i batch size, D the maximum batch size, tau
iterations per round, V_i worker i's label distribution, Phi_0 the IID (mean) distribution, c
the bandwidth one sample's features take, B the parameter server's ingress bandwidth budget,
K_i participation counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_TINY = 1e-12


def moving_average(previous: np.ndarray | None, measured: np.ndarray, alpha: float = 0.8) -> np.ndarray:
    """Eq. 5-6: mu_i^h = alpha mu_i^{h-1} + (1 - alpha) mu_hat_i^h (likewise beta); the first
    measurement stands alone."""
    measured = np.asarray(measured, float)
    return measured.copy() if previous is None else alpha * np.asarray(previous, float) + (1 - alpha) * measured


def durations(tau: int, d: np.ndarray, mu: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Eq. 7: t_i = tau d_i (mu_i + beta_i)."""
    return tau * np.asarray(d, float) * (np.asarray(mu, float) + np.asarray(beta, float))


def average_waiting(t: np.ndarray) -> float:
    """Eq. 8: W = (1/N) sum_i (max_j t_j - t_i)."""
    t = np.asarray(t, float)
    return float(np.mean(t.max() - t)) if len(t) else 0.0


def regulate_batch_sizes(mu: np.ndarray, beta: np.ndarray, max_batch: int) -> np.ndarray:
    """Eq. 9: the fastest worker l gets D; worker i gets floor(D (mu_l + beta_l) / (mu_i + beta_i)).

    As printed, the floor wraps only the ratio, which is <= 1 for every worker slower than l
    and would give them batch 0 (docs/papers.md, MergeSFL: Eq. 9 as printed). rayfl reads the
    floor around the whole product, so durations align (t_i ~ t_l), with at least one sample
    per worker.
    """
    per_sample = np.asarray(mu, float) + np.asarray(beta, float)
    fastest = per_sample.min()
    return np.maximum(1, np.floor(max_batch * fastest / per_sample + 1e-9)).astype(int)


def within_bandwidth(d: np.ndarray, selected: np.ndarray, c: float, budget: float) -> bool:
    """Eq. 10: sum_{i in S} d_i c <= B."""
    return float(np.sum(np.asarray(d)[np.asarray(selected, bool)]) * c) <= budget + 1e-9


def merged_distribution(V: np.ndarray, d: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """Eq. 11: Phi_h = sum_{i in S} d_i V_i / sum_{i in S} d_i."""
    sel = np.asarray(selected, bool)
    w = np.asarray(d, float)[sel]
    return (w[:, None] * np.asarray(V, float)[sel]).sum(0) / w.sum()


def kl(phi_h: np.ndarray, phi_0: np.ndarray) -> float:
    """Eq. 12: KL(Phi_h || Phi_0) = sum_j Phi_h(j) log(Phi_h(j) / Phi_0(j)), with 0 log 0 = 0."""
    p, q = np.asarray(phi_h, float), np.asarray(phi_0, float)
    nz = p > 0
    return float(np.sum(p[nz] * np.log(p[nz] / np.maximum(q[nz], _TINY))))


def priority(K: np.ndarray) -> np.ndarray:
    """Eq. 13: p_i = sum_j (K_j + 1) / (K_i + 1): rarely chosen workers come first."""
    k1 = np.asarray(K, float) + 1
    return k1.sum() / k1


@dataclass(frozen=True)
class GAConfig:
    """The genetic algorithm of Alg. 1 l.4-5 (the paper leaves its operators open)."""

    population: int = 100
    generations: int = 150
    islands: int = 4
    """Independent populations; the best of their results wins."""
    crossover: float = 0.9
    mutation: float | None = None
    """Per-gene flip probability; None means 1 / N."""
    tournament: int = 2
    penalty: float = 1.0
    """Fitness added per unit of relative excess over the bandwidth budget (Eq. 10)."""


def kl_of_sets(sets: np.ndarray, V: np.ndarray, d: np.ndarray, phi_0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 11-12 for many worker sets at once (rows of a boolean matrix): (KL, feature load sum d_i)."""
    x = np.asarray(sets, float)
    load = x @ d
    phi = (x * d) @ V / np.maximum(load, _TINY)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(phi > 0, phi * np.log(phi / np.maximum(phi_0, _TINY)), 0.0)
    return terms.sum(1), load


def genetic_select(
    V: np.ndarray,
    d: np.ndarray,
    phi_0: np.ndarray,
    prio: np.ndarray,
    c: float,
    budget: float,
    g: np.random.Generator,
    config: GAConfig = GAConfig(),
) -> np.ndarray:
    """Alg. 1 l.4-5: the worker set (boolean mask) minimising KL(Phi_h || Phi_0) (Eq. 11-12)
    under the bandwidth budget sum_{i in S} d_i c <= B (Eq. 10).

    A gene says whether a worker is selected. Each island starts from sets of m = N/2 workers
    drawn with probability proportional to their priority (Eq. 13); fitness is KL plus
    `penalty` times the relative excess over the budget (infeasible sets may be crossed
    through, never returned); tournament selection, uniform crossover, bit-flip mutation and
    one elite per generation. The best feasible set seen is then polished by descent over
    single flips and swaps. Returns no worker when no non-empty set fits the budget.
    """
    V, d, phi_0 = np.asarray(V, float), np.asarray(d, float), np.asarray(phi_0, float)
    results = [_island(V, d, phi_0, np.asarray(prio, float), c, budget, g, config) for _ in range(config.islands)]
    polished = [_descend(r, V, d, phi_0, c, budget) for r in results if r is not None]
    if not polished:
        return np.zeros(len(d), bool)
    return min(polished, key=lambda s: kl_of_sets(s[None], V, d, phi_0)[0][0])


def seed_population(prio: np.ndarray, size: int, g: np.random.Generator) -> np.ndarray:
    """Alg. 1 l.4 with Eq. 13: `size` initial worker sets (rows) of m = N/2 workers each, drawn
    without replacement with probability proportional to their priority p_i."""
    n = len(prio)
    pop = np.zeros((size, n), bool)
    for k in range(size):
        pop[k, g.choice(n, size=max(1, n // 2), replace=False, p=prio / prio.sum())] = True
    return pop


def _island(V, d, phi_0, prio, c, budget, g, config: GAConfig) -> np.ndarray | None:
    n, size = len(d), config.population
    pop = seed_population(prio, size, g)
    flip = config.mutation if config.mutation is not None else 1.0 / n
    best, best_kl = None, np.inf
    for generation in range(config.generations + 1):
        kls, load = kl_of_sets(pop, V, d, phi_0)
        over = np.maximum(0.0, load * c - budget) / budget
        fit = np.where(pop.any(1), kls + config.penalty * over, np.inf)
        feasible = (over == 0) & pop.any(1)
        if feasible.any():
            k = np.flatnonzero(feasible)[np.argmin(kls[feasible])]
            if kls[k] < best_kl:
                best, best_kl = pop[k].copy(), kls[k]
        if generation == config.generations:
            return best
        entrants = g.integers(size, size=(size, 2, config.tournament))
        winners = np.take_along_axis(entrants, np.argmin(fit[entrants], axis=2)[..., None], axis=2)[..., 0]
        parents_a, parents_b = pop[winners[:, 0]], pop[winners[:, 1]]
        cross = (g.random(size) < config.crossover)[:, None] & (g.random((size, n)) < 0.5)
        children = np.where(cross, parents_b, parents_a) ^ (g.random((size, n)) < flip)
        children[0] = pop[np.argmin(fit)]  # elitism
        pop = children
    return best


def _descend(sel: np.ndarray, V, d, phi_0, c: float, budget: float) -> np.ndarray:
    """Best-improvement descent over single flips and swaps (one in, one out) within the budget."""
    n = len(d)
    best, best_kl = sel.copy(), kl_of_sets(sel[None], V, d, phi_0)[0][0]
    while True:
        inside, outside = np.flatnonzero(best), np.flatnonzero(~best)
        swaps = np.zeros((len(inside) * len(outside), n), bool)
        rows = np.arange(len(swaps))
        swaps[rows, np.repeat(inside, len(outside))] = True
        swaps[rows, np.tile(outside, len(inside))] = True
        candidates = best[None] ^ np.concatenate([np.eye(n, dtype=bool), swaps])
        kls, load = kl_of_sets(candidates, V, d, phi_0)
        kls[(load * c > budget + 1e-9) | ~candidates.any(1)] = np.inf
        k = int(np.argmin(kls))
        if kls[k] >= best_kl - 1e-15:
            return best
        best, best_kl = candidates[k], kls[k]


def finetune_batch_sizes(
    V: np.ndarray, d: np.ndarray, per_sample: np.ndarray, phi_0: np.ndarray, epsilon: float, max_batch: int
) -> np.ndarray:
    """Alg. 1 l.6, Eq. 14: adjust the selected workers' batch sizes to reach KL(Phi_h || Phi_0) <= eps
    at the least added time Delta = (1/R) sum_i |Delta d_i| (mu_i + beta_i).

    The paper solves it as a Lagrange dual; rayfl solves the same constrained problem with
    scipy's SLSQP on a smooth |.| over real batch sizes in [1, D], rounds to integers, and then,
    while the rounded sizes exceed eps, takes the single +-1 step with the most KL reduction per
    added time (`_repair`), so the constraint holds whenever integers in [1, D] can meet it.
    Batch sizes already within eps are returned unchanged.
    """
    from scipy.optimize import minimize  # imported here: every process loads the algorithms, few run Eq. 14

    V, d0 = np.asarray(V, float), np.asarray(d, float)
    w = np.asarray(per_sample, float) / len(d0)
    everyone = np.ones(len(d0), bool)
    if kl(merged_distribution(V, d0, everyone), phi_0) <= epsilon:
        return np.asarray(d, int).copy()
    smooth = 1e-3

    def added_time(x: np.ndarray) -> float:
        return float(np.sum(w * np.sqrt((x - d0) ** 2 + smooth)))

    def slack(x: np.ndarray) -> float:
        return epsilon - kl(merged_distribution(V, x, everyone), phi_0)

    res = minimize(
        added_time, d0, method="SLSQP", bounds=[(1, max_batch)] * len(d0), constraints=[{"type": "ineq", "fun": slack}]
    )
    return _repair(np.clip(np.rint(res.x), 1, max_batch).astype(int), V, d0, w, phi_0, epsilon, max_batch)


def _repair(
    d: np.ndarray, V: np.ndarray, d0: np.ndarray, w: np.ndarray, phi_0: np.ndarray, epsilon: float, max_batch: int
) -> np.ndarray:
    """Integer sizes meeting KL <= eps: from `d`, the +-1 step with the largest KL reduction per
    unit of added Eq. 14 time, until the constraint holds or no step reduces KL."""
    n = len(d)
    steps = np.concatenate([np.eye(n, dtype=int), -np.eye(n, dtype=int)])
    current = kl(merged_distribution(V, d, np.ones(n, bool)), phi_0)
    while current > epsilon:
        candidates = d[None] + steps
        ok = (candidates >= 1).all(1) & (candidates <= max_batch).all(1)
        kls = np.array(
            [
                kl(merged_distribution(V, x, np.ones(n, bool)), phi_0) if good else np.inf
                for x, good in zip(candidates, ok)
            ]
        )
        added = (np.abs(candidates - d0) - np.abs(d - d0)) @ w
        gain = np.where(kls < current, (current - kls) / np.maximum(added, _TINY), -np.inf)
        if gain.max() == -np.inf:
            break
        k = int(np.argmax(gain))
        d, current = candidates[k], kls[k]
    return d


def fill_bandwidth(d: np.ndarray, c: float, budget: float, max_batch: int) -> np.ndarray:
    """Alg. 1 l.7: scale all batch sizes by one factor s so that sum_i d_i c uses the budget
    (Eq. 10) as fully as integers allow: s = min(B / (c sum_i d_i), D / max_i d_i), so the sizes
    stay in proportion (the durations Eq. 9 aligned stay aligned) and the largest is at most D;
    each is floor(s d_i), at least 1."""
    d = np.asarray(d, float)
    s = min(budget / (d.sum() * c), max_batch / d.max())
    scaled = np.maximum(1, np.floor(d * s + 1e-9)).astype(int)
    while scaled.sum() * c > budget + 1e-9 and (scaled > 1).any():  # the floor of 1 may overshoot
        scaled[np.argmax(scaled)] -= 1
    return scaled

"""The one client loop's rules (docs/design.md, "On a GPU: the worker, not the client, is the
unit"), pinned by counting what crosses between host and device (`rayfl.crossings.Crossings`,
exact on the CPU): nothing is read back or indexed from the host inside a step; a client reads
its device values back once; weights are copied into cached modules, never loaded with
`load_state_dict` nor turned into numpy; a client's samples move to the device once per host;
a vectorized call's copies do not grow with the clients it trains."""

import pytest

from rayfl.algorithms import base
from rayfl.algorithms.aggregate import Sum
from rayfl.crossings import Crossings
from rayfl.engine import ClientRunner, build_federation, run_group, torch_threads
from rayfl.load import load_config

TINY = ["model.name=mlp", "model.hidden=[8]", "data.num_clients=40", "federation.local_epochs=2"]


def call_of(sets, clients):
    fed = build_federation(load_config(None, [*TINY, *sets]))
    state = fed.policy.init_state(fed.initial_weights())
    return fed, fed.policy.configure(state, 1, clients)


def counted(fed, runner, tasks, monkeypatch):
    """The crossings of one call, by region: the procedure's steps ("step"), producing a client's
    samples ("data"), the one read of a client's values ("read"), the call's sum leaving ("sum")."""
    c = Crossings()
    step, data, finish, arrays = type(fed.procedure).step, ClientRunner.data, base.finish, Sum.arrays

    def within(name, f):
        def run(*args, **kwargs):
            with c.region(name):
                return f(*args, **kwargs)

        return run

    monkeypatch.setattr(type(fed.procedure), "step", within("step", step))
    monkeypatch.setattr(ClientRunner, "data", within("data", data))
    monkeypatch.setattr(base, "finish", within("read", finish))
    monkeypatch.setattr(Sum, "arrays", within("sum", arrays))
    with torch_threads(), c:
        out = run_group(runner, fed.account, tasks, True)
    monkeypatch.undo()
    assert all(r.status == "ok" for r in out.settled)
    return c


def get(c, region, kind):
    return c.counts.get(region, {}).get(kind, 0)


@pytest.mark.parametrize(
    "sets, own, sums",
    [
        (["algorithm.name=fedavg"], 0, 1),
        (["algorithm.name=fedprox"], 0, 1),
        # HeteroFL: each client's label mask for its loss, and its classifier rows (weight and
        # bias) for the count sum; a sum and a count per tensor
        (["algorithm.name=heterofl", "algorithm.levels=a1", "model.norm=none"], 3, 2),
    ],
    ids=["fedavg", "fedprox", "heterofl"],
)
def test_a_sequential_call_keeps_to_the_rules(sets, own, sums, monkeypatch):
    fed, tasks = call_of(sets, list(range(8)))
    runner = ClientRunner.of(fed)
    steps = []
    original = type(fed.procedure).step
    monkeypatch.setattr(type(fed.procedure), "step", lambda *a: steps.append(1) or original(*a))
    first, again = counted(fed, runner, tasks, monkeypatch), counted(fed, runner, tasks, monkeypatch)
    n, tensors = len(tasks), len(tasks[0].weights)
    assert len(steps) >= 2 * 2 * n  # every client took steps (two epochs), in both calls
    for c in (first, again):
        # inside a step: nothing read back, no host data or index, no conversion
        assert all(get(c, "step", k) == 0 for k in ("scalar_reads", "to_device", "to_host"))
        # a client: its losses and tensors' max-abs read back in one copy, nothing else
        assert c.total("scalar_reads") == 0
        assert get(c, "read", "to_host") == n
        assert get(c, "sum", "to_host") == sums * tensors  # the call's sum, once
        assert c.total("to_host") == n + sums * tensors  # no weights to numpy
        assert c.total("load_state_dict") == 0
    assert first.total("optimizer_builds") <= 1 and again.total("optimizer_builds") == 0
    # the samples: moved once per host (inputs and labels), not again
    assert get(first, "data", "to_device") == 2 * n and get(again, "data", "to_device") == 0
    # what crosses per call besides them: the call's weights once, each client's batch plan
    # and what the algorithm reads per client
    assert again.total("to_device") == tensors + n + own * n


def test_a_vectorized_calls_copies_do_not_grow_with_its_clients(monkeypatch):
    # Dirichlet sizes: clients run out of batches at different steps and sit steps out.
    counts = {}
    for k in (4, 16):
        fed, tasks = call_of([f"ray.vectorize={k}", f"ray.clients_per_call={k}"], list(range(k)))
        runner = ClientRunner.of(fed)
        counted(fed, runner, tasks, monkeypatch)  # the samples' first move; the layout's probe
        c = counted(fed, runner, tasks, monkeypatch)
        counts[k] = {kind: c.total(kind) for kind in ("scalar_reads", "to_device", "to_host", "load_state_dict")}
        sizes = fed.clients.sizes()[:k]
        assert len(set(sizes)) > 1
    assert counts[4] == counts[16]
    assert counts[16]["scalar_reads"] == 0 and counts[16]["load_state_dict"] == 0

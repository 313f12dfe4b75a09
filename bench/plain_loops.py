"""The floor every rayfl figure in bench/ is divided by: plain PyTorch loops over a cohort of clients.

This module imports torch and numpy only (never rayfl), so what it measures is what a careful
user's own loop costs. It is the loop pfl-research describes: one model instance, its weights
written into the module with `copy_` for each client, one optimizer whose state is cleared per
client, each client's data moved to the device once, batches sliced from a permutation drawn on
the device, no value read back during training, and the clients' weights added into one float64
running sum on the device (the same sum rayfl keeps, so both do the same work).

`bench/client_cost.py` calls `train_cohort` with a model and arrays it prepared, `bench/gpu_scale.py`
`plain_throughput` (the chip's ceiling for a model at a batch); `bench/fedavg_reference.py` runs
`fedavg` as a process of its own.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def train_cohort(
    model: nn.Module,
    weights: dict[str, torch.Tensor],
    clients: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float = 0.0,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Train each client from `weights` (device tensors, state-dict names) for `epochs` epochs of
    SGD at `batch_size`; returns sum_k n_k w_k in float64 and "#weight" sum_k n_k, on the device."""
    device = next(model.parameters()).device
    state = model.state_dict(keep_vars=True)
    names = list(state)
    tensors = [state[n] for n in names]
    sources = [weights[n] for n in names]
    total = [torch.zeros(t.shape, dtype=torch.float64, device=device) for t in tensors]
    scratch = [torch.empty_like(t, dtype=torch.float64) for t in total]
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    count = 0
    for k, (x, y) in enumerate(clients):
        with torch.no_grad():
            torch._foreach_copy_(tensors, sources)
        opt.state.clear()
        x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        g = torch.Generator(device).manual_seed(seed * 1_000_003 + k)
        for _ in range(epochs):
            order = torch.randperm(len(y), generator=g, device=device)
            for i in range(0, len(y), batch_size):
                b = order[i : i + batch_size]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x[b]), y[b]).backward()
                opt.step()
        with torch.no_grad():
            for t, s, w in zip(total, scratch, tensors):
                s.copy_(w)
                t.add_(s, alpha=len(y))
        count += len(y)
    return {**dict(zip(names, total)), "#weight": torch.tensor(float(count), dtype=torch.float64)}


def plain_throughput(
    model: nn.Module, shape: Sequence[int], classes: int, batch: int, device: str, seconds: float = 2.0
) -> float:
    """Images a second of plain SGD steps (momentum 0.9) of `model` at `batch` on one batch of
    random inputs of `shape` kept on `device`: the chip's ceiling for the model at that batch
    (after three untimed steps; the steps run in chunks, each waited for, until `seconds` pass)."""
    x = torch.randn(batch, *shape, device=device)
    y = torch.randint(0, classes, (batch,), device=device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model.train()

    def steps(n: int) -> None:
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()

    steps(3)
    done, start, chunk = 0, time.perf_counter(), 1
    while time.perf_counter() - start < seconds:
        steps(chunk)
        done += chunk
        chunk = min(2 * chunk, 64)
    return done * batch / (time.perf_counter() - start)


def cnn2(channels: int, height: int, width: int, classes: int) -> nn.Sequential:
    """FedAvg's CNN (McMahan et al. 2017) as `bench/fedavg_reference.py` trains it: two 5x5 "same"
    convolutions of 32 and 64 channels with 2x2 max-pooling, 512 hidden units, a linear classifier;
    an `nn.Sequential` with the state-dict names of rayfl's `cnn2`, so one initial state fits both."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * (height // 4) * (width // 4), 512),
        nn.ReLU(),
        nn.Linear(512, classes),
    )


def fedavg(workload: str) -> dict:
    """FedAvg as a plain loop over a workload file (`bench/fedavg_reference.py` writes it: the
    training and test arrays, each client's indices, each round's clients and their batch orders,
    the initial weights): one thread, one process. Returns the final accuracy and the loop's time."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    with np.load(workload) as archive:
        w = dict(archive)
    x, y = torch.from_numpy(w["x_train"]), torch.from_numpy(w["y_train"])
    x_test, y_test = torch.from_numpy(w["x_test"]), torch.from_numpy(w["y_test"])
    model = cnn2(*x.shape[1:], int(w["classes"]))
    model.load_state_dict({k[len("init/") :]: torch.from_numpy(v) for k, v in w.items() if k.startswith("init/")})
    lr, momentum, chosen = float(w["lr"]), float(w["momentum"]), w["chosen"]
    parts = np.split(w["parts"], np.cumsum(w["part_sizes"])[:-1])
    batches = iter(np.split(w["order"], np.cumsum(w["batch_sizes"])[:-1]))
    per_client = iter(w["batches"])
    state = model.state_dict(keep_vars=True)
    tensors = list(state.values())
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loop_start = time.perf_counter()
    for clients in chosen:
        start_state = [t.detach().clone() for t in tensors]
        total = [torch.zeros_like(t, dtype=torch.float64) for t in tensors]
        n_total = 0
        for c in clients:
            with torch.no_grad():
                torch._foreach_copy_(tensors, start_state)
            opt.state.clear()
            idx = parts[c]
            xc, yc = x[idx], y[idx]
            model.train()
            for _ in range(next(per_client)):
                b = torch.from_numpy(next(batches))
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(xc[b]), yc[b]).backward()
                opt.step()
            with torch.no_grad():
                for acc, t in zip(total, tensors):
                    acc.add_(t.double(), alpha=len(idx))
            n_total += len(idx)
        with torch.no_grad():
            for acc, t in zip(total, tensors):
                t.copy_(acc / n_total)
        model.eval()
        with torch.no_grad():
            accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
    end = time.perf_counter()
    return {"accuracy": accuracy, "loop_s": end - loop_start, "inside_s": end - start}


if __name__ == "__main__":
    print(json.dumps(fedavg(sys.argv[1])))

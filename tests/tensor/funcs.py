"""Functions the tensor engine tests run on the procs (importable there by name)."""

from __future__ import annotations

import os
import time

import torch

from monarch.actor import Actor, current_rank, endpoint


def boom(t: torch.Tensor) -> torch.Tensor:
    raise ValueError("boom: this remote function always fails")


def add_scaled(a: torch.Tensor, b: torch.Tensor, k: float = 1.0) -> torch.Tensor:
    return a + k * b


def split_halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t[: t.shape[0] // 2].clone(), t[t.shape[0] // 2:].clone()


def pid() -> int:
    return os.getpid()


def live_refs() -> int:
    from monarch._tensor import worker

    assert worker.current is not None
    return len(worker.current.env)


def slow_identity(t: torch.Tensor, seconds: float) -> torch.Tensor:
    time.sleep(seconds)
    return t.clone()


class ShardTrainer(Actor):
    """Gets a remote tensor as its proc's shard."""

    @endpoint
    def step(self, t: torch.Tensor) -> tuple[int, float]:
        return current_rank().rank, float(t.sum())


class Linear(Actor):
    """An actor whose endpoint makes remote tensors (``forward.rref``)."""

    def __init__(self) -> None:
        self.w = torch.ones(3, 3)

    @endpoint(propagate=lambda x: x)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w

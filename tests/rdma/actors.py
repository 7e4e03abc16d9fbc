"""Actors for the RDMABuffer tests (importable by name in procs)."""

from __future__ import annotations

import os

import torch

from monarch.actor import Actor, endpoint
from monarch.rdma import RDMABuffer


class Owner(Actor):
    """Holds a tensor and hands out an RDMABuffer over it."""

    def __init__(self, n: int):
        self.t = (torch.arange(n, dtype=torch.int64) % 251).to(torch.uint8)
        self.buf: RDMABuffer | None = None

    @endpoint
    def handle(self) -> RDMABuffer:
        self.buf = RDMABuffer(self.t)
        return self.buf

    @endpoint
    def checksum(self) -> int:
        return int(self.t.to(torch.int64).sum())

    @endpoint
    def drop_own(self) -> None:
        assert self.buf is not None
        self.buf.drop().get()

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Reader(Actor):
    """Reads and writes buffers that others own."""

    @endpoint
    def read_sum(self, buf: RDMABuffer) -> int:
        dst = torch.zeros(buf.size(), dtype=torch.uint8)
        buf.read_into(dst).get()
        return int(dst.to(torch.int64).sum())

    @endpoint
    def write_ones(self, buf: RDMABuffer) -> None:
        buf.write_from(torch.ones(buf.size(), dtype=torch.uint8)).get()

    @endpoint
    def read_error(self, buf: RDMABuffer) -> str:
        try:
            buf.read_into(torch.zeros(buf.size(), dtype=torch.uint8)).get(timeout=30)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "no error"

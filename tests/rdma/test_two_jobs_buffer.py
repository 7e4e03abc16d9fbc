"""An RDMABuffer the client owns, read by actors of two jobs the client holds at once.

The client has one runtime per job, each with that job's keys; a buffer named the client's first
runtime as its owner, so a proc of the second job, which holds only its own job's keys, could not
ask the owner for the bytes (reads through the owner: another host, or cross-memory reads refused)."""

from __future__ import annotations

import pytest
import torch

from monarch.job import ProcessJob
from monarch.rdma import RDMABuffer
from tests.rdma.actors import Reader

pytestmark = pytest.mark.timeout(300)

T = 60


def test_a_clients_buffer_is_read_by_actors_of_two_jobs(monkeypatch, no_leaked_processes):
    monkeypatch.setenv("MONARCH_RDMA_CMA", "0")  # through the owner: its runtime, not its memory
    jobs = [ProcessJob({"hosts": 1}, env={"MONARCH_RDMA_CMA": "0"}) for _ in range(2)]
    try:
        readers = [job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 1}).spawn("reader", Reader)
                   for job in jobs]
        t = (torch.arange(5000, dtype=torch.int64) % 251).to(torch.uint8)
        buf = RDMABuffer(t)
        expected = int(t.to(torch.int64).sum())
        for reader in readers:
            assert reader.read_sum.call_one(buf).get(timeout=T) == expected
        # And the other way: each job's actor writes it.
        t.zero_()
        readers[1].write_ones.call_one(buf).get(timeout=T)
        assert int(t.sum()) == 5000
    finally:
        for job in jobs:
            job.kill()

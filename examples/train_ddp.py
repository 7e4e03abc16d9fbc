"""A tiny CPU DDP training script (gloo), run by torchrun on every reserved host.

    $ monarch serve --hosts 2
    $ monarch run -- torchrun --nproc-per-node=2 examples/train_ddp.py

Every rank trains a 16->32->1 MLP on the same seeded data split by rank; the
final loss printed by rank 0 equals a single-process run over the full data.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    y = x.sum(dim=1, keepdim=True)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    shard = slice(rank * 64 // world, (rank + 1) * 64 // world)
    steps = int(os.environ.get("STEPS", "20"))
    for _step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[shard]), y[shard])
        loss.backward()
        opt.step()
    with torch.no_grad():
        full = torch.nn.functional.mse_loss(model.module(x), y).item()
    if rank == 0:
        print(f"final_loss {full:.6f} world {world}", flush=True)
    # Teardown, every rank alike: nobody leaves while another still talks to it, DDP goes before
    # its process group, and the group is destroyed.
    dist.barrier()
    del model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # With torch 2.13, DDP keeps its gloo process group alive after destroy_process_group(): the
    # group's threads (gloo_tcp_loop, pt_gloo_runloop) still run, so a normal interpreter exit
    # tears C++ state down under them: the likely source of the rank that now and then ended with
    # SIGABRT ("terminate called without an active exception") after its work was done.
    # Everything is written and closed by here, so leave without that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

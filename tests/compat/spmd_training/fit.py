"""Fit y = 3x - 1 with a one-weight model under DistributedDataParallel (gloo, CPU): each rank sees
its own data; DDP averages the gradients, so every rank ends with the same weights.  Each rank
writes what it ended with to $COMPAT_OUT/rank<N>."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(100 + rank)  # different data on every rank
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(args.steps):
        x = torch.rand(16, 1, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), 3 * x - 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    weights = torch.cat([t.detach().flatten() for t in model.parameters()])
    everyone = [torch.empty_like(weights) for _ in range(world)]
    dist.all_gather(everyone, weights)
    same = all(torch.equal(w, everyone[0]) for w in everyone)
    out = os.environ.get("COMPAT_OUT")
    if out:
        with open(os.path.join(out, f"rank{rank}"), "w") as f:
            f.write(f"local_rank={os.environ['LOCAL_RANK']} world={world} same_weights={same}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

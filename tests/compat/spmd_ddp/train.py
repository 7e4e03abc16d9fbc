# The train.py of PyTorch Monarch's DDP examples (docs/source/examples/ddp/train.py), on CPU:
# gloo instead of nccl, no torch.cuda calls. It also checks that the ranks' parameters agree at
# the end (all_gather) and writes one line per rank where the test can read it.
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(local_rank)

    model = nn.Linear(10, 1)
    ddp_model = DDP(model)

    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)

    for step in range(5):
        inputs = torch.randn(4, 10)
        outputs = ddp_model(inputs)
        loss = outputs.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"[Rank {rank}] Step {step} loss={loss.item()}")

    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    in_sync = all(torch.equal(g, gathered[0]) for g in gathered)
    out = os.environ.get("COMPAT_OUT")
    if out:
        with open(os.path.join(out, f"rank{rank}"), "w") as f:
            f.write(f"rank={rank} world={dist.get_world_size()} in_sync={in_sync}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

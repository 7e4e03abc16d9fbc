"""Data-parallel training on the nodes of a SlurmJob, one actor per node (run on the real Slurm
cluster by tests/schedulers/test_slurm_job_api.py).

Exercises: ``SlurmJob(meshes=..., job_name=..., time_limit=...)``, ``job.state().<mesh>``,
``spawn_procs(per_host)``, ``monarch.spmd.setup_torch_elastic_env_async`` (the torch elastic
environment on every proc), async endpoints awaited with ``await mesh.endpoint.call()``, and
``job.kill()`` in a ``finally``.  Prints the world size, whether the ranks' weights agree after
training, and which nodes the ranks ran on.
"""

import asyncio
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from monarch.actor import Actor, current_rank, endpoint
from monarch.job import SlurmJob
from monarch.spmd import setup_torch_elastic_env_async


class Trainer(Actor):
    """Fits a small two-layer network on data of its own; DDP keeps every rank's weights equal."""

    @endpoint
    async def join(self) -> int:
        dist.init_process_group("gloo", rank=current_rank().rank, world_size=int(os.environ["WORLD_SIZE"]))
        return dist.get_world_size()

    @endpoint
    async def train(self, steps: int) -> tuple:
        torch.manual_seed(1234 + dist.get_rank())  # each rank's own initial weights and data
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        ddp = DistributedDataParallel(model)  # broadcasts rank 0's weights to all
        opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
        for _ in range(steps):
            x = torch.randn(32, 8)
            loss = (ddp(x) - x[:, :2].sum(dim=1, keepdim=True)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        everyone = [torch.empty_like(weights) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, weights)
        return all(torch.equal(w, everyone[0]) for w in everyone), os.environ.get("MONARCH_HOSTNAME", "")

    @endpoint
    async def leave(self) -> None:
        dist.destroy_process_group()


async def main() -> None:
    job = SlurmJob(meshes={"trainers": 2}, job_name="monarch_allreduce", time_limit="00:30:00")
    try:
        procs = job.state().trainers.spawn_procs({"gpus": 1})
        trainers = procs.spawn("trainers", Trainer)
        await setup_torch_elastic_env_async(procs)
        world = await trainers.join.call()
        results = await trainers.train.call(20)
        await trainers.leave.call()
        print(f"world sizes: {sorted(set(world.values()))}")
        print(f"weights agree: {[r[0] for r in results.values()]}")
        print(f"nodes: {sorted(r[1] for r in results.values())}")
        print("training on the Slurm job finished")
    finally:
        job.kill()  # the nodes go back to the cluster


if __name__ == "__main__":
    asyncio.run(main())

# PyTorch Monarch's example notebook examples/slurm_ddp.ipynb (DDP on a SlurmJob), as a script.
# Changed from the original, for a CPU-only Slurm cluster: num_nodes=2 and gpus_per_node=1 (one
# proc per node; SlurmJob is not asked for GPUs), the model and labels stay on the CPU (no
# .to(local_rank), DDP without device_ids), `await main()` is `asyncio.run(main())`, and the
# notebook's undefined `setup_env_for_distributed` is monarch.spmd's setup_torch_elastic_env_async,
# which it imports for that. The actors also return their results so the test can check them.
import asyncio
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim

from monarch.actor import Actor, current_rank, endpoint
from monarch.job import SlurmJob
from monarch.spmd import setup_torch_elastic_env_async
from torch.nn.parallel import DistributedDataParallel as DDP


logging.basicConfig(
    level=logging.INFO,
    format="%(name)s %(asctime)s %(levelname)s %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S",
    force=True,
)


logger: logging.Logger = logging.getLogger(__name__)


class ToyModel(nn.Module):
    """A simple toy model for demonstration purposes."""

    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class DDPActor(Actor):
    """This Actor wraps the basic functionality from Torch's DDP example.

    Adapted from: https://docs.pytorch.org/tutorials/intermediate/ddp_tutorial.html#basic-use-case
    """

    def __init__(self):
        self.rank = current_rank().rank

    def _rprint(self, msg):
        """Helper method to print with rank information."""
        print(f"{self.rank=} {msg}")

    @endpoint
    async def setup(self):
        """Initialize the PyTorch distributed process group."""
        self._rprint("Initializing torch distributed")

        WORLD_SIZE = int(os.environ["WORLD_SIZE"])
        # initialize the process group
        dist.init_process_group("gloo", rank=self.rank, world_size=WORLD_SIZE)
        self._rprint("Finished initializing torch distributed")
        return WORLD_SIZE

    @endpoint
    async def cleanup(self):
        """Clean up the PyTorch distributed process group."""
        self._rprint("Cleaning up torch distributed")
        dist.destroy_process_group()

    @endpoint
    async def demo_basic(self):
        """Run a basic DDP training example."""
        self._rprint("Running basic DDP example")

        local_rank = int(os.environ["LOCAL_RANK"])
        self._rprint(f"{local_rank=}")
        model = ToyModel()
        ddp_model = DDP(model)

        loss_fn = nn.MSELoss()
        optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))
        labels = torch.randn(20, 5)
        loss_fn(outputs, labels).backward()
        optimizer.step()

        print(f"{self.rank=} Finished running basic DDP example")
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        return all(torch.equal(g, gathered[0]) for g in gathered), os.environ.get("MONARCH_HOSTNAME", "")


async def main():
    num_nodes = 2
    gpus_per_node = 1
    mesh_name = "mesh0"

    # Create SLURM job
    slurm_job = SlurmJob(
        meshes={mesh_name: num_nodes},
        job_name="monarch_example",
        time_limit="06:00:00",
    )

    try:
        # Get job state and create process mesh
        job_state = slurm_job.state()
        proc_mesh = job_state.mesh0.spawn_procs({"gpus": gpus_per_node})

        # Spawn DDP actor
        ddp_actor = proc_mesh.spawn("ddp_actor", DDPActor)

        # Setup distributed environment
        await setup_torch_elastic_env_async(proc_mesh)

        # Run DDP example
        world = await ddp_actor.setup.call()
        results = await ddp_actor.demo_basic.call()
        await ddp_actor.cleanup.call()

        print(f"world sizes: {sorted(set(world.values()))}")
        print(f"params in sync: {[r[0] for r in results.values()]}")
        print(f"nodes: {sorted(r[1] for r in results.values())}")
        print("DDP example completed successfully!")

    finally:
        # Cancel the SLURM job, releasing all reserved nodes back to the cluster
        slurm_job.kill()
        logger.info("Job terminated successfully")


if __name__ == "__main__":
    asyncio.run(main())

# PyTorch Monarch's documented example docs/source/examples/ddp/spmd_ddp.py (DDP using SPMDActor).
# Changed from the original: GPUS_PER_HOST is 2 (this machine has no GPUs; train.py beside this file
# uses gloo on CPU), and the docstring's copy of train.py is left out.
"""
DDP using SPMDActor
============================

This example demonstrates how to run PyTorch's Distributed Data Parallel (DDP)
using Monarch's ``SPMDActor``. The actor configures torch elastic environment
variables and executes the training script, replicating torchrun behavior.
"""

import os

from monarch.actor import this_host
from monarch.spmd import SPMDActor


GPUS_PER_HOST = 2

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
TRAIN_SCRIPT = os.path.join(SCRIPT_DIR, "train.py")

# %%
# Create a process mesh on the local host with ``GPUS_PER_HOST`` processes.

local_proc_mesh = this_host().spawn_procs(per_host={"gpus": GPUS_PER_HOST})

# %%
# Spawn ``SPMDActor`` on the process mesh. The actor will configure the
# distributed environment variables (RANK, LOCAL_RANK, WORLD_SIZE, etc.)
# and execute the training script.

spmd_actors = local_proc_mesh.spawn("_SPMDActor", SPMDActor)

first_values = dict.fromkeys(local_proc_mesh._labels, 0)
master_addr, master_port = (
    spmd_actors.slice(**first_values).get_host_port.call_one(None).get()
)

spmd_actors.main.call(master_addr, master_port, [TRAIN_SCRIPT]).get()

print("DDP example completed successfully!")

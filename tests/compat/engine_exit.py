"""``DeviceMesh.exit()`` on the mesh ``spawn_tensor_engine`` returns, as Monarch's
python/examples/rapid_spawn_exit_stress.py loops it: the engine's work is done and it ends, the proc
mesh stays, and a new engine on the same procs computes again.  On CPU.  Runs unchanged on monarch
and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import torch

from monarch import fetch_shard
from monarch.actor import Actor, endpoint, this_host
from monarch.mesh_controller import spawn_tensor_engine


class Probe(Actor):
    @endpoint
    def ping(self) -> int:
        return 1


procs = this_host().spawn_procs(per_host={"gpus": 2})
for i in range(3):
    dm = spawn_tensor_engine(procs)
    with dm.activate():
        t = torch.ones(2) * (i + 1)
        print("engine", i, fetch_shard(t, gpus=1).result().tolist())
    dm.exit()
print("procs still answer:", procs.spawn("probe", Probe).ping.call().get().values())
print("done")

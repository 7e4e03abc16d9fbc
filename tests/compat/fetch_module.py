"""``monarch.fetch`` as Monarch's examples import it (``from monarch.fetch import fetch_shard``):
the same ``fetch_shard`` and ``inspect`` as ``monarch``'s, fetching one proc's shard of a tensor
made under a proc mesh's ``activate()``, on CPU.  Runs unchanged on monarch and on torchmonarch
0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import torch

import monarch
from monarch.actor import this_host
from monarch.fetch import fetch_shard, inspect, show  # noqa: F401 - show needs torchshow to draw

print("same as monarch's:", fetch_shard is monarch.fetch_shard, inspect is monarch.inspect)
procs = this_host().spawn_procs(per_host={"gpus": 2})
with procs.activate():
    t = torch.arange(4.0) + 1
    print("shard of gpus=1:", fetch_shard(t, gpus=1).result().tolist())
    print("inspect gpus=0:", inspect(t, {"gpus": 0}).tolist())
print("done")

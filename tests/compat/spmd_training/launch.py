"""Data-parallel training started through ``monarch.spmd.SPMDActor``: one actor per proc sets the
torch elastic environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...) and runs ``fit.py`` beside
this file, as torchrun would.  Usage: python launch.py   (COMPAT_OUT: where each rank reports)
"""

import os

from monarch.actor import this_host
from monarch.spmd import SPMDActor

PROCS = 2
HERE = os.path.dirname(os.path.abspath(__file__))

procs = this_host().spawn_procs(per_host={"workers": PROCS})
trainers = procs.spawn("trainers", SPMDActor)
addr, port = trainers.slice(workers=0).get_host_port.call_one(None).get()
trainers.main.call(addr, port, [os.path.join(HERE, "fit.py"), "--steps", "8"]).get()
procs.stop().get()
print("training finished on", PROCS, "ranks")

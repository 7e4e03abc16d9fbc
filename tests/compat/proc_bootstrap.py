"""How procs start, as a program sets it: ``spawn_procs(bootstrap_command=...)`` (one command for
every proc, or one per proc from its point), ``HostMesh.with_python_executable`` (procs run that
program, and so do the procs they spawn with ``this_host()``), and what ``this_host()`` is inside
an actor: its own host, placed among the hosts its mesh was spawned on.  Runs unchanged on monarch
and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import os
import stat
import sys
import tempfile

from monarch._rust_bindings.monarch_hyperactor.shape import Shape, Slice
from monarch.actor import Actor, context, default_bootstrap_cmd, endpoint, this_host
from monarch.job import ProcessJob


class Env(Actor):
    @endpoint
    def get(self, name: str) -> str:
        return os.environ.get(name, "")

    @endpoint
    def spawn_here(self) -> "Env":
        return this_host().spawn_procs(per_host={"procs": 1}).spawn("inner", Env)


class Here(Actor):
    @endpoint
    def host(self) -> tuple:
        h = this_host()
        s = h.region.slice()
        return list(h.extent.labels), s.offset, s.sizes

    @endpoint
    def cut_to_mine(self) -> tuple:
        rank = context().actor_instance.rank.rank
        mine = this_host()._new_with_shape(Shape(labels=["hosts"], slice=Slice(offset=rank, sizes=[1], strides=[1])))
        pm = mine.spawn_procs(per_host={"gpus": 1})
        s = mine.region.slice()
        return mine.region.labels, s.offset, pm.spawn("env", Env).get.call_one("COLOR").get()


host = this_host()
one = host.spawn_procs(per_host={"gpus": 2}, bootstrap_command=default_bootstrap_cmd().with_env({"COLOR": "red"}))
print("one command:", sorted(v for _, v in one.spawn("env", Env).get.call("COLOR").get()))
plain = host.spawn_procs(per_host={"gpus": 1})
print("next spawn without it:", repr(plain.spawn("env", Env).get.call_one("COLOR").get()))


def per_proc(point) -> object:
    return default_bootstrap_cmd().with_env({"COLOR": f"shade{point['gpus']}"})


each = host.spawn_procs(per_host={"gpus": 3}, bootstrap_command=per_proc)
print("one per proc:", [v for _, v in each.spawn("env", Env).get.call("COLOR").get()])

folder = tempfile.mkdtemp(prefix="compat_python_")
wrapper = os.path.join(folder, "python")
with open(wrapper, "w") as f:
    f.write(f'#!/bin/sh\nexport WRAPPED_BY=$$\nexec {sys.executable} "$@"\n')
os.chmod(wrapper, stat.S_IRWXU)
wrapped = host.with_python_executable(wrapper).spawn_procs(per_host={"procs": 1}).spawn("env", Env)
outer = wrapped.get.call_one("WRAPPED_BY").get()
inner = wrapped.spawn_here.call_one().get().get.call_one("WRAPPED_BY").get()
print("wrapped:", outer != "", "inner wrapped again:", inner not in ("", outer))
os.remove(wrapper)
os.rmdir(folder)

job = ProcessJob({"hosts": 3})
try:
    hosts = job.state(cached_path=None).hosts
    here = hosts.spawn_procs().spawn("here", Here)
    print("this_host in actors:", [v for _, v in here.host.call().get()])
    print("cut to its own:", [v for _, v in here.cut_to_mine.call().get()])
finally:
    job.kill()
print("done")

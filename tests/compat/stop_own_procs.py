"""Stopping a proc mesh stops its own procs only; a slice of a mesh may not be stopped.

Runs unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import os

from monarch.actor import Actor, endpoint, this_host


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def pids(mesh) -> list:
    return [pid for _, pid in mesh.pid.call().get()]


def outcome(fn) -> str:
    try:
        fn()
        return "ok"
    except Exception as e:
        return type(e).__name__


host = this_host()
first = host.spawn_procs(per_host={"gpus": 2})
second = host.spawn_procs(per_host={"gpus": 2})
on_first, on_second = first.spawn("on_first", Pid), second.spawn("on_second", Pid)
before = pids(on_second)
print("both answer:", len(pids(on_first)), len(before))

first.stop().get()
print("first stopped, second's procs unchanged:", pids(on_second) == before)
print("first after its stop:", outcome(lambda: on_first.pid.call().get()))

third = host.spawn_procs(per_host={"gpus": 2})
on_third = third.spawn("on_third", Pid)
third_pids = pids(on_third)
print("stopping a slice:", outcome(lambda: third.slice(gpus=0).stop().get()))
print("slice's stop stopped nothing:", pids(on_third) == third_pids)

second.stop().get()
third.stop().get()
print("done")

"""Host meshes compare as Monarch's do: the same hosts in the same arrangement are equal, so the
``this_host()`` an actor sees is the client's slice of that host; different hosts are not.
Runs unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

from monarch.actor import Actor, endpoint, this_host
from monarch.job import ProcessJob


class Where(Actor):
    @endpoint
    def host(self):
        return this_host()


job = ProcessJob({"hosts": 2})
state = job.state(cached_path=None)
try:
    hosts = state.hosts
    each = [hosts.slice(hosts=i) for i in range(2)]
    print("a slice equals itself made again:", each[0] == hosts.slice(hosts=0))
    print("two hosts differ:", each[0] != each[1])
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    seen = list(procs.spawn("where", Where).host.call().get().values())
    print("actors see their host:", seen == [each[0], each[0], each[1], each[1]])
    try:
        hash(seen[0])
        print("hashable: True")
    except TypeError:
        print("hashable: False")
    procs.stop().get()
finally:
    job.kill()
print("done")

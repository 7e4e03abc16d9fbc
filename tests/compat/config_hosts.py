"""``hosts_from_config(name)`` (from monarch.actor and monarch.job): a host mesh of workers this
program starts on this machine and attaches to; its ``shutdown()`` ends them."""

from monarch.actor import Actor, endpoint, hosts_from_config
from monarch.job import hosts_from_config as from_job


class Where(Actor):
    @endpoint
    def host_rank(self) -> str:
        import os

        return os.environ.get("MONARCH_HOST_RANK", "?")


print("same function:", from_job is hosts_from_config)
hosts = hosts_from_config("trainers")
print(hosts.extent, sorted(hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where).host_rank.call().get().values()))
hosts.shutdown().get()
print("shut down")

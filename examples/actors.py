"""A single-controller actor program: runs as `python examples/actors.py` or `monarch run examples/actors.py`."""

from monarch.actor import Actor, current_rank, endpoint, this_host


class Counter(Actor):
    def __init__(self, start: int):
        self.n = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    def where(self) -> str:
        import os

        return f"rank {current_rank().rank} on {os.environ.get('MONARCH_HOSTNAME')} (pid {os.getpid()})"


if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    counters = procs.spawn("counters", Counter, 10)
    print(counters.incr.call(2).get())
    print(counters.slice(gpus=1).incr.call_one().get())
    for line in counters.where.call().get().values():
        print(line)
    procs.stop().get()

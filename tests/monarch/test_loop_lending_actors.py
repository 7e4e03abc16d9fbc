"""A proc's actor thread runs the proc's IO loop while it waits for its next message
(``monarch_agents.transport.Mailbox.run_until``): what must still reach the proc while that thread is
busy, or while another thread waits, does.  Real procs on this host; no timing thresholds."""

from __future__ import annotations

import threading
import time

from monarch.actor import Actor, endpoint, this_host

T = 60


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x

    @endpoint
    def handled_on(self) -> str:
        # The loop may be lent to this very thread: each call is still run on the actor's thread.
        return threading.current_thread().name

    @endpoint
    def times_the_loop_was_borrowed(self) -> int:
        from monarch_agents.runtime import current

        return current().mailbox._lent_gen

    @endpoint
    def busy(self, seconds: float) -> str:
        time.sleep(seconds)  # holds this actor's thread: the proc's IO thread serves the loop meanwhile
        return "done"


class SlowStart(Actor):
    """An async actor whose __init__ takes a while: calls queue meanwhile, then go straight to its loop."""

    def __init__(self) -> None:
        time.sleep(0.3)
        self.seen: list = []

    @endpoint
    async def note(self, i: int) -> int:
        self.seen.append(i)
        return i

    @endpoint
    async def order(self) -> list:
        return self.seen

    @endpoint
    async def threads(self) -> list:
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("actor-"))


class Caller(Actor):
    """Calls another actor from inside an endpoint (the answer comes through this proc's loop)."""

    def __init__(self, other: Echo):
        self.other = other

    @endpoint
    def relay(self, n: int) -> list:
        return [self.other.ping.call_one(i).get(timeout=T) for i in range(n)]

    @endpoint
    def relay_from_threads(self, n: int) -> list:
        # Several threads of the proc wait at once: one may run the loop, the others sleep.
        out: list = [None] * n
        ts = [threading.Thread(target=lambda i=i: out.__setitem__(i, self.other.ping.call_one(i).get(timeout=T)))
              for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(T)
        return out


def test_calls_run_on_the_actors_thread_in_order():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        echo = procs.spawn("lend_echo", Echo)
        futures = [echo.ping.call_one(i) for i in range(200)]
        assert [f.get(timeout=T) for f in futures] == list(range(200))
        for _ in range(50):
            assert echo.handled_on.call_one().get(timeout=T) == "actor-lend_echo"
        # The path under test is the one taken: the actor's thread ran the loop itself.
        assert echo.times_the_loop_was_borrowed.call_one().get(timeout=T) > 0
    finally:
        procs.stop().get(timeout=T)


def test_another_actor_of_a_busy_proc_answers():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        a = procs.spawn("lend_busy", Echo)
        b = procs.spawn("lend_free", Echo)
        assert a.ping.call_one(1).get(timeout=T) == 1 and b.ping.call_one(2).get(timeout=T) == 2
        busy = a.busy.call_one(2.0)
        assert [b.ping.call_one(i).get(timeout=T) for i in range(20)] == list(range(20))
        assert not busy.done()  # b answered while a was still busy
        assert busy.get(timeout=T) == "done"
    finally:
        procs.stop().get(timeout=T)


def test_an_actor_calls_another_and_waits_from_several_threads():
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        echo = procs.slice(gpus=1).spawn("lend_callee", Echo)
        caller = procs.slice(gpus=0).spawn("lend_caller", Caller, echo)
        assert caller.relay.call_one(30).get(timeout=T) == list(range(30))
        assert caller.relay_from_threads.call_one(6).get(timeout=T) == list(range(6))
        assert caller.relay.call_one(5).get(timeout=T) == list(range(5))
    finally:
        procs.stop().get(timeout=T)


def test_an_async_actor_gets_its_calls_in_order_before_and_after_its_loop_runs():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        slow = procs.spawn("lend_slow", SlowStart)
        early = [slow.note.call_one(i) for i in range(50)]  # posted while __init__ runs: queued
        assert [f.get(timeout=T) for f in early] == list(range(50))
        late = [slow.note.call_one(i) for i in range(50, 100)]  # straight to its running loop
        assert [f.get(timeout=T) for f in late] == list(range(50, 100))
        assert slow.order.call_one().get(timeout=T) == list(range(100))
        assert slow.threads.call_one().get(timeout=T) == ["actor-lend_slow"]  # one thread: no pump
    finally:
        procs.stop().get(timeout=T)

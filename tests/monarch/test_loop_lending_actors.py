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


#: Released by the first call posted to ``LateLoop`` (see ``Gate.arm``): its __init__ waits for it.
_late_go = threading.Event()


class LateLoop(Actor):
    """An async actor whose loop starts only once its first call is being posted."""

    def __init__(self) -> None:
        _late_go.wait(T)

    @endpoint
    async def ping(self, x: int) -> int:
        return x


class Gate(Actor):
    """Holds the posting of ``LateLoop``'s first call between ``post``'s look at ``_direct`` (None: its
    loop not running yet) and its put into the thread's mailbox, until its loop runs: the interleaving
    that a thread switch at the wrong bytecode makes, made every time."""

    @endpoint
    def arm(self, name: str) -> bool:
        import queue

        from monarch_agents.context import CURRENT

        agent = CURRENT.get().actor.slot.agent
        slot = next(s for s in list(agent.actors.values()) if s.msg.name == name)

        class HeldQueue(queue.SimpleQueue):
            def put(self, item, block=True, timeout=None):
                if not _late_go.is_set():
                    _late_go.set()  # its __init__ returns, then its loop runs and drains the queue
                    deadline = time.monotonic() + T
                    while slot._direct is None and time.monotonic() < deadline:
                        time.sleep(0.01)
                super().put(item)

        held = HeldQueue()
        while not slot.mailbox.empty():
            queue.SimpleQueue.put(held, slot.mailbox.get_nowait())
        slot.mailbox = held
        return True


def test_a_call_posted_while_an_async_actors_loop_starts_is_not_lost():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        gate = procs.spawn("lend_gate", Gate)
        late = procs.spawn("lend_late", LateLoop)
        assert gate.arm.call_one("lend_late").get(timeout=T)
        assert late.ping.call_one(7).get(timeout=T) == 7
        assert late.ping.call_one(8).get(timeout=T) == 8
    finally:
        procs.stop().get(timeout=T)

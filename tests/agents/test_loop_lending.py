"""Lending the IO loop (``Mailbox.run_until``): a thread that waits for what the loop brings runs it
itself, and the IO thread takes it back once nobody does.  Real mailboxes over Unix sockets and TCP,
real procs for the actor side; no timing thresholds (each wait is bounded only to fail, not to measure).
"""

from __future__ import annotations

import queue
import threading

import pytest
import zmq

from monarch_agents import messages as m
from monarch_agents.future import Future
from monarch_agents.transport import JobKeys, Mailbox

pytestmark = pytest.mark.timeout(120)

T = 30


class Box:
    """A started mailbox that records each message with the thread that handled it."""

    def __init__(self, keys: JobKeys, name: str, local_ipc: bool):
        self.received: queue.Queue = queue.Queue()
        self.ctx = zmq.Context()
        self.ctx.linger = 0
        self.mb = Mailbox(keys, lambda msg: self.received.put((msg, threading.get_ident())), name=name,
                          ctx=self.ctx, local_ipc=local_ipc)
        self.addr = self.mb.start()

    def close(self) -> None:
        self.mb.close()
        self.ctx.destroy(linger=0)


@pytest.fixture(params=["ipc", "tcp"])
def pair(request):
    keys = JobKeys.generate()
    a = Box(keys, "a", request.param == "ipc")
    b = Box(keys, "b", request.param == "ipc")
    yield a, b
    a.close()
    b.close()


def _borrow_until(mb: Mailbox, ready, timeout: float = T):
    """run_until, asking again until the IO thread has lent the loop out (it does after a turn)."""
    for _ in range(1000):
        if not mb._running:
            return False
        got = mb.run_until(ready, timeout)
        if got is not None:
            return got
        mb.wake()  # a turn ends: the IO thread lends the loop out after it
        threading.Event().wait(0.001)
    raise AssertionError("the loop was never lent out")


def test_a_borrower_handles_messages_on_its_own_thread_then_the_io_thread_takes_the_loop_back(pair):
    a, b = pair
    me = threading.get_ident()
    a.mb.send(b.addr, m.Ping(m.PortRef(a.addr, 1)))  # connects, so later sends go straight out
    assert b.received.get(timeout=T)[0] == m.Ping(m.PortRef(a.addr, 1))

    seen: list = []
    sender = threading.Thread(target=lambda: [a.mb.send(b.addr, m.Ping(m.PortRef(a.addr, i))) for i in (2, 3, 4)])

    def ready() -> bool:
        if not sender.ident:  # first asked once this thread runs the loop: only then is anything sent
            sender.start()
        while not b.received.empty():
            seen.append(b.received.get())
        return len(seen) >= 3

    assert _borrow_until(b.mb, ready) is True
    sender.join(T)
    # In order, and handled here (the loop was run by this thread).
    assert [msg.reply.port_id for msg, _ in seen] == [2, 3, 4]
    assert {tid for _, tid in seen} == {me}
    # Nobody runs the loop now: the IO thread takes it back and handles what comes.
    a.mb.send(b.addr, m.Ping(m.PortRef(a.addr, 5)))
    msg, tid = b.received.get(timeout=T)
    assert msg.reply.port_id == 5 and tid != me


def test_a_borrower_times_out_and_a_future_finished_off_the_loop_wakes_it(pair):
    _, b = pair
    assert _borrow_until(b.mb, lambda: False, timeout=0.05) is False  # nothing came: its timeout
    fut: Future = Future()
    threading.Timer(0.05, lambda: fut.set_result(42)).start()  # finished by another thread
    fut._polled_by = b.mb
    try:
        assert _borrow_until(b.mb, fut.done) is True
    finally:
        fut._polled_by = None
    assert fut.get(timeout=T) == 42


def test_while_a_thread_sleeps_waiting_for_the_loop_it_is_not_lent_out(pair):
    a, b = pair
    sleeper: Future = Future()
    b.mb.sleep_begin(sleeper)
    try:
        b.mb.wake()
        assert b.mb.run_until(lambda: True) is None and b.mb.run_until(lambda: True) is None
        # The IO thread keeps handling messages meanwhile.
        a.mb.send(b.addr, m.Ping(m.PortRef(a.addr, 9)))
        assert b.received.get(timeout=T)[0].reply.port_id == 9
    finally:
        b.mb.sleep_end(sleeper)
    assert b.mb._sleepers == 0


def test_closing_a_mailbox_ends_a_borrower(pair):
    _, b = pair
    out: list = []
    started = threading.Event()

    def borrow() -> None:
        started.set()
        out.append(_borrow_until(b.mb, lambda: False))

    t = threading.Thread(target=borrow)
    t.start()
    started.wait(T)
    threading.Event().wait(0.05)
    b.close()
    t.join(T)
    assert not t.is_alive() and out == [False]


def test_two_threads_wait_on_one_future_finished_off_the_loop_and_both_wake(pair, monkeypatch):
    """One waiter runs the loop, the other sleeps counted among its sleepers; the future is finished
    by a third thread (off the loop): the one running the loop must look, not wait for the loop's
    next event (none comes on an idle mailbox)."""
    from monarch_agents import future

    _, b = pair
    monkeypatch.setattr(future, "process_loop", b.mb)
    # No timer ends a turn of the loop by itself (its once-a-second delivery check would wake a
    # waiter nobody woke, a second late): only a wake-up can.
    cleared = threading.Event()
    b.mb.call_soon(lambda: (b.mb._timers.clear(), cleared.set()))
    assert cleared.wait(T)
    for _ in range(100):
        fut: Future = Future()
        got: list = []
        runner = threading.Thread(target=lambda f=fut, out=got: out.append(f.get()), daemon=True)
        _borrow_until(b.mb, lambda: True)  # lent out now, and free
        runner.start()
        while b.mb._owner != runner.ident and fut._sleeping is None and runner.is_alive():
            threading.Event().wait(0.001)
        if b.mb._owner == runner.ident:
            break
        fut.set_result(0)  # it slept instead (the IO thread took the loop back first): again
        runner.join(T)
    else:
        raise AssertionError("the waiter never ran the loop")
    sleeper = threading.Thread(target=lambda: got.append(fut.get()), daemon=True)
    sleeper.start()
    while fut._sleeping is None and sleeper.is_alive():
        threading.Event().wait(0.001)
    fut.set_result(42)  # this thread does not run the loop
    sleeper.join(T)
    runner.join(T)
    assert not runner.is_alive() and not sleeper.is_alive(), "a waiter was not woken"
    assert got == [42, 42]

"""Control messages to many host agents through a tree of host agents, answers merged on the way back.

A command for every host of a reservation (run, signal, status, query, stop) is a list of
``(addr, host, message)``, one message per host.  :func:`fan_out` cuts that list into at most
``degree`` subtrees and sends each as one :class:`~monarch_agents.messages.Fanout` to the
subtree's first host; that agent (``monarch_agents.services.fanout``) handles its own message,
cuts the rest the same way, and sends each answer up as it comes, several per message.  So the
client holds ``degree`` connections and the deepest host is ``log_degree(hosts)`` hops away,
instead of one connection and one message per host.

Each message's answer is found where its own ``reply`` port would get it (a ``RunCommand``'s end
where its ``exit_to`` would): a node gives the message a port of its own and passes the ``Reply``
up as ``(ok, value)`` under the message's index.  Nothing is lost and nothing hangs: a child
agent that dies (its connection closes) makes its own index an error, and what it had not yet
answered for is sent again, by this node, to the rest of its subtree; past the deadline every
index not answered is an error that says so.  Each level's deadline is a little shorter than its
parent's, so the error names the level that did not answer.  A command with no deadline (a run's
ends) pings the children it waits on instead, and one silent too long (stopped, hung: no
connection closes) is lost the same way.  A receiver acknowledges a Fanout at once; a child that
does not (an agent of a version without fan-outs drops it) has its subtree asked straight.

Who may ask: ``Fanout`` is the client's, as every message it carries is (a host agent the
client started holds the client's key, so its forward is the client's; a proc's or a pod's
key is refused, see ``monarch_agents.host_agent``).

:data:`DEGREE` and :data:`DIRECT_MAX` are the one switch (``MONARCH_FANOUT_DEGREE``,
``MONARCH_FANOUT_DIRECT_MAX``): reservations of at most ``DIRECT_MAX`` hosts, or a degree of 0,
get every message straight from the client, through the same code.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any, Callable

from monarch_agents import messages as m
from monarch_agents.errors import SupervisionError
from monarch_agents.keys import CLIENT

log = logging.getLogger("monarch.fanout")


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:  # a bad value must not break every import of this module: the default
        log.warning("%s=%r is not a whole number; using %d", name, os.environ.get(name), default)
        return default


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        log.warning("%s=%r is not a positive number of seconds; using %g", name, os.environ.get(name), default)
        return default
    return value


#: How many subtrees each node (and the client) sends to; 0: every message straight from the client.
DEGREE = _env_int("MONARCH_FANOUT_DEGREE", 8)
#: Up to this many hosts, the client sends every message itself (one hop, no agent in between).
DIRECT_MAX = _env_int("MONARCH_FANOUT_DIRECT_MAX", 8)
#: Each level gives its children this fraction of the time it has left (they answer before it gives up).
_CHILD_SHARE = 0.9
#: ...and this many seconds less.
_CHILD_MARGIN_S = 0.02

#: A node without a deadline (a run's ends) pings each child it still waits on this often, and takes
#: one it has not heard from (answers or pings) for :data:`_SILENT_S` for lost: an agent stopped
#: (SIGSTOP) or hung closes no connection, and a run would wait for it forever.
_PING_EVERY_S = _env_float("MONARCH_FANOUT_PING_S", 5.0)
_SILENT_S = _env_float("MONARCH_FANOUT_SILENT_S", 30.0)

#: How long a Fanout's receiver has to say it got it (at most a third of the time left), else its
#: subtree is asked straight: an agent of a version without fan-outs drops the message unanswered.
_ACK_S = _env_float("MONARCH_FANOUT_ACK_S", 3.0)

#: Messages a node hands its own agent only once its subtree has answered (a Shutdown: an inner
#: agent must stay up until what it forwarded has been answered through it).
_LOCAL_LAST = (m.Shutdown,)

#: An index's answer: (True, the reply's value) or (False, why there is none, one line).
Result = tuple
#: What an agent that cannot forward (it holds no client key: a pod's) answers for the rest of its
#: subtree: its parent sends those messages itself.
CANNOT_FORWARD = (False, "cannot forward: this host agent holds no client key")


def split(items: list, degree: int) -> list[list]:
    """Cut ``items`` into at most ``degree`` contiguous subtrees (each sent to its first item's host)."""
    if not items:
        return []
    k = max(1, degree)
    per = -(-len(items) // k)
    return [items[i:i + per] for i in range(0, len(items), per)]


def answer_port(msg: Any, port: m.PortRef) -> tuple[Any, bool]:
    """``msg`` with its answer sent to ``port`` (``exit_to`` for a run, else ``reply``), and whether
    one comes at all (a SignalRun has no answer: delivered is all there is to say)."""
    fields = getattr(msg, "__dataclass_fields__", {})
    if "exit_to" in fields:
        return dataclasses.replace(msg, exit_to=port), True
    if "reply" in fields:
        return dataclasses.replace(msg, reply=port), True
    return msg, False


def _one_line(e: BaseException | str) -> str:
    text = str(e)
    return (text.splitlines() or [type(e).__name__ if isinstance(e, BaseException) else "error"])[0]


#: How long a lost child's answer may still arrive on its other connection (see ``_Port.lost``).
_LOST_GRACE_S = 0.5


class _Port:
    """A port of a node: answers from one child (or from this agent itself) to ``node``."""

    __slots__ = ("node", "child", "port_id", "heard", "pong", "raw", "acked")

    def __init__(self, node: "Node", child: str, raw: bool = True):
        self.node = node
        self.child = child
        #: The child got its own message as it is (one answer), not a Fanout (answers by index).
        self.raw = raw
        #: A Fanout's receiver says at once that it got it; one that does not is an agent of a
        #: version without fan-outs (or is not there), and its subtree is asked straight.
        self.acked = raw
        self.port_id = 0
        self.heard = time.monotonic()  # when the child last answered anything
        self.pong = 0  # the port of the ping it has not answered yet

    def deliver(self, reply: m.Reply) -> None:
        self.heard = time.monotonic()
        self.node._delivered(self, reply)

    def lost(self, addr: str, error: SupervisionError) -> None:
        # The child's answer comes on the connection it dialed to us, its loss is seen on the one we
        # dialed to it: a child that answered and then stopped (a Shutdown) can be seen gone before
        # its answer is read.  The answer gets a moment; once it is in, the loss finds no entry.
        self.node.rt.mailbox.call_later(_LOST_GRACE_S, lambda: self.node._child_lost(self, error))


class _Pong:
    """The answer to a liveness ping: the child is there."""

    __slots__ = ("port", "port_id")

    def __init__(self, port: _Port):
        self.port = port
        self.port_id = 0

    def deliver(self, reply: m.Reply) -> None:
        self.port.heard = time.monotonic()
        self.port.node.rt.close_port(self.port_id)

    def lost(self, addr: str, error: SupervisionError) -> None:
        pass  # its child's own port hears it too


class Node:
    """One fan-out of ``items`` (``(index, addr, host, message)``) from this process.

    ``local``: a function that hands this agent's own message (the first item) to its handler; ``report(results)`` gets ``{index: (ok, value)}`` as answers come,
    several at once; ``done()`` once every index is answered.  All of it runs on the runtime's IO
    thread.
    """

    def __init__(self, rt: Any, items: list, degree: int, timeout_s: float | None,
                 report: Callable[[dict], None], done: Callable[[], None] = lambda: None,
                 local: Callable[[Any], None] | None = None, direct: bool = False):
        self.rt = rt
        self.degree = degree
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.report = report
        self.on_done = done
        self.local = local
        self.direct = direct
        self.items = {i: (i, addr, host, msg) for i, addr, host, msg in items}
        self.pending = set(self.items)
        self.ports: dict[int, tuple[_Port, list]] = {}  # port id -> (port, the indices sent through it)
        self.outbox: dict[int, Result] = {}
        self.flushing = False
        self.finished = False
        self._later_local: Any = None

    # -- sending -------------------------------------------------------------

    def start(self) -> None:
        """Send every subtree, then hand this agent its own message (on the IO thread)."""
        ordered = list(self.items.values())
        own = ordered[:1] if self.local is not None else []  # a Fanout's first item is its receiver's
        rest = ordered[len(own):]
        if self.direct:
            for it in rest:
                self._send([it])
        else:
            for sub in split(rest, self.degree):
                self._send(sub)
        for it in own:
            if isinstance(it[3], _LOCAL_LAST) and self.pending - {it[0]}:
                self._later_local = it  # once the subtree has answered
            else:
                self._run_local(it)
        if self.deadline is not None:
            self.rt.mailbox.call_later(max(0.0, self.deadline - time.monotonic()), self._expired)
        else:
            self.rt.mailbox.call_later(_PING_EVERY_S, self._probe)
        self._check_done()

    def _probe(self) -> None:
        """Ping every child still owing answers; one silent for :data:`_SILENT_S` is lost."""
        if self.finished:
            return
        now = time.monotonic()
        for port, _ in list(self.ports.values()):
            if not port.child:
                continue
            if now - port.heard > _SILENT_S:
                self._child_lost(port, SupervisionError(f"no answer for {_SILENT_S:g} s: stopped or hung?"))
                continue
            if port.pong:
                self.rt.close_port(port.pong)
            pong = _Pong(port)
            ref = self.rt.open_port(pong, (port.child,))
            port.pong = ref.port_id
            try:
                self.rt.send(port.child, m.Ping(ref))
            except Exception as e:  # known dead: its port hears it
                log.debug("fan-out: ping to %s: %s", port.child, e)
        if not self.finished:
            self.rt.mailbox.call_later(_PING_EVERY_S, self._probe)

    def _child_timeout(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, (self.deadline - time.monotonic()) * _CHILD_SHARE - _CHILD_MARGIN_S)

    def _send(self, sub: list, raw: bool | None = None) -> None:
        """Send subtree ``sub`` to its first host (a lone message as it is, when ``raw``: direct)."""
        raw = self.direct if raw is None else raw
        head = sub[0]
        port = _Port(self, head[1], raw)
        ref = self.rt.open_port(port, (head[1],))
        self.ports[port.port_id] = (port, [it[0] for it in sub])
        try:
            if raw:
                msg, answers = answer_port(head[3], ref)
                self.rt.send(head[1], msg)
                if not answers:
                    self._answer(head[0], (True, None))
                    self._close(port)
            else:
                self.rt.send(head[1], m.Fanout(sub, self.degree, self._child_timeout(), ref))
                self.rt.mailbox.call_later(self._ack_wait(), lambda: self._check_ack(port))
        except Exception as e:  # known dead, or it cannot be sent at all: the same as a child lost
            self._child_lost(port, e if isinstance(e, SupervisionError) else SupervisionError(_one_line(e)))

    def _ack_wait(self) -> float:
        if self.deadline is None:
            return _ACK_S
        return min(_ACK_S, max(0.05, (self.deadline - time.monotonic()) / 3))

    def _check_ack(self, port: _Port) -> None:
        """A child that has not said it got its Fanout: its subtree is asked straight from here."""
        entry = self.ports.get(port.port_id)
        if entry is None or port.acked or self.finished:
            return
        log.warning("fan-out: %s did not take a Fanout within %.1f s (an agent without fan-outs?); "
                    "asking its %d hosts straight", port.child, self._ack_wait(), len(entry[1]))
        self._close(port)
        for i in entry[1]:
            if i in self.pending:
                self._send([self.items[i]], raw=True)
        self._check_done()

    def _run_local(self, it: tuple) -> None:
        port = _Port(self, "")
        ref = self.rt.open_port(port, (self.rt.addr,))
        self.ports[port.port_id] = (port, [it[0]])
        msg, answers = answer_port(it[3], ref)
        try:
            self.local(msg)
        except Exception as e:
            log.exception("fan-out: handling %s here failed", type(msg).__name__)
            self._answer(it[0], (False, f"{type(msg).__name__} failed on {it[2]}: {_one_line(e)}"))
            self._close(port)
            return
        if not answers:
            self._answer(it[0], (True, None))
            self._close(port)

    # -- answers ---------------------------------------------------------------

    def _delivered(self, port: _Port, reply: m.Reply) -> None:
        entry = self.ports.get(port.port_id)
        if entry is None:
            return
        role = self.rt.mailbox.sender_role
        if port.child == "" and role != "self":
            return  # the local port answers only this agent's own handlers
        indices = entry[1]
        if not port.raw:
            if not reply.ok or not isinstance(reply.payload, dict):
                return
            port.acked = True
            again = []
            for i, r in reply.payload.items():
                if i in indices and r == CANNOT_FORWARD:
                    again.append(i)
                elif i in indices and isinstance(r, tuple) and len(r) == 2:
                    self._answer(i, (bool(r[0]), r[1]))
            if again:
                # An agent without the client's key (a pod's) cannot forward: its subtree, straight from here.
                entry[1][:] = [i for i in indices if i not in again]
                for i in again:
                    if i in self.pending:
                        self._send([self.items[i]], raw=True)
            if not any(i in self.pending for i in entry[1]):
                self._close(port)
            return
        value = reply.payload if reply.ok else _one_line(_error_of(reply.payload))
        self._answer(indices[0], (reply.ok, value))
        self._close(port)

    def _child_lost(self, port: _Port, error: SupervisionError) -> None:
        """A child died (or could not be reached): its own index is an error; the rest of what it had
        not answered for goes again, from here, as a subtree of its own."""
        entry = self.ports.get(port.port_id)
        if entry is None or self.finished:
            return
        self._close(port)
        left = [self.items[i] for i in entry[1] if i in self.pending]
        if not left:
            return
        head, rest = left[0], left[1:]
        if head[1] == port.child or port.raw:
            self._answer(head[0], (False, f"host agent on {head[2]} stopped answering ({_one_line(error)})"))
        else:
            rest = left
        if rest:
            self._send(rest)
        self._check_done()

    def _expired(self) -> None:
        if self.finished:
            return
        for i in sorted(self.pending):
            self._answer(i, (False, f"host agent on {self.items[i][2]} gave no answer in time"))
        self._check_done()

    def _answer(self, index: int, result: Result) -> None:
        if index not in self.pending:
            return
        self.pending.discard(index)
        self.outbox[index] = result
        if self._later_local is not None and self.pending == {self._later_local[0]}:
            it, self._later_local = self._later_local, None
            self._run_local(it)
        if not self.flushing:
            # Answers that arrive together go up together: the flush runs after what is queued.
            self.flushing = True
            self.rt.mailbox.call_soon(self._flush)

    def _flush(self) -> None:
        self.flushing = False
        out, self.outbox = self.outbox, {}
        if out:
            try:
                self.report(out)
            except Exception:
                log.exception("fan-out: reporting %d answers failed", len(out))
        self._check_done()

    def _check_done(self) -> None:
        if self.pending or self.outbox or self.finished:
            return
        self.finished = True
        for port, _ in list(self.ports.values()):
            self._close(port)
        self.on_done()

    def _close(self, port: _Port) -> None:
        self.ports.pop(port.port_id, None)
        self.rt.close_port(port.port_id)
        if port.pong:
            self.rt.close_port(port.pong)


def _error_of(payload: Any) -> BaseException:
    from monarch_agents.runtime import _as_exception

    return _as_exception(payload, restricted=True)


class FanoutCall:
    """A fan-out from a client: its answers by index as they come (:attr:`results`)."""

    def __init__(self, n: int, on_result: Callable[[int, Result], None] | None):
        self.n = n
        self.results: dict[int, Result] = {}
        self.on_result = on_result
        self.cond = threading.Condition()
        self.node: Node | None = None
        #: Set once every message has been handed to the transport (or found undeliverable).
        self.sent = threading.Event()

    def _report(self, results: dict) -> None:
        with self.cond:
            self.results.update(results)
            self.cond.notify_all()
        if self.on_result is not None:
            for i, r in sorted(results.items()):
                try:
                    self.on_result(i, r)
                except Exception:
                    log.exception("fan-out: on_result failed")

    def wait(self, timeout: float | None = None) -> bool:
        """Until every index is answered (True), or ``timeout`` seconds (False)."""
        with self.cond:
            return self.cond.wait_for(lambda: len(self.results) >= self.n, timeout)

    @property
    def done(self) -> bool:
        return len(self.results) >= self.n


def use_tree(n: int, degree: int | None = None) -> bool:
    """Whether ``n`` hosts are asked through the tree (else straight from the client)."""
    degree = DEGREE if degree is None else degree
    return degree > 0 and n > DIRECT_MAX


def fan_out(rt: Any, targets: list[tuple[str, str, Any]], *, timeout_s: float | None,
            on_result: Callable[[int, Result], None] | None = None, degree: int | None = None,
            direct: bool | None = None) -> FanoutCall:
    """Send ``targets`` (``(addr, host, message)``, one message per host agent) through the tree.

    Returns at once; the call's ``results`` fill in by index (position in ``targets``) as
    ``(True, answer)`` or ``(False, why)``; ``on_result(index, result)`` runs for each (on the IO
    thread: keep it short).  ``timeout_s`` None: no deadline (a run's ends).  ``direct``: every
    message from here (default: :func:`use_tree` decides)."""
    degree = DEGREE if degree is None else degree
    if direct is None:
        # Only the client's key may ask an agent to forward (a proc's Fanout is refused).
        direct = not use_tree(len(targets), degree) or getattr(rt.keys, "role", CLIENT) != CLIENT
    call = FanoutCall(len(targets), on_result)
    items = [(i, addr, host, msg) for i, (addr, host, msg) in enumerate(targets)]
    if not items:
        call.sent.set()
        return call
    node = Node(rt, items, max(1, degree), timeout_s, call._report, direct=direct)
    call.node = node

    def start() -> None:
        try:
            node.start()
        finally:
            call.sent.set()

    rt.mailbox.call_soon(start)
    return call

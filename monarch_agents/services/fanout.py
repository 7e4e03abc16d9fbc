"""The fan-out service: a host agent's place in a tree that carries one control message per host.

A ``Fanout`` (``monarch_agents.fanout``) names this agent's own message first and then its
subtree: the service forwards the subtree's parts to their first hosts, hands its own message
to this agent's handler as if it had come alone (with the answer port replaced by one of the
tree's), and sends the answers up as they come, merged per index.  It runs on the IO thread:
forwarding is a few sends, and a message's real work is its own service's.

Who may send one: the client (its key; the host agents the client started hold it too, so their
forwards are the client's).  Procs and pods' host agents may not (``HostAgent._admit``), and each
message inside must be one of :data:`CARRIED`, checked here before anything is forwarded.

A run's owner: a rank started through the tree is owned, as any, by the client that asked; but
rather than each host connecting back to the client to watch it, an agent watches the agent it
got the run from (``HostAgent.track_owner_via``) and turns to the client itself only once that
one is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from monarch_agents import messages as m
from monarch_agents.fanout import CANNOT_FORWARD, Node, fan_out
from monarch_agents.keys import CLIENT
from monarch_agents.services import Service
from monarch_rdmafs import messages as wm

log = logging.getLogger("monarch.host_agent")

#: What a fan-out may carry: the control messages a client sends every host.
CARRIED = (m.Ping, m.SignalRun, m.RunCommand, m.TelemetryScan, m.TakeStacks, m.Shutdown, m.StopProcs, m.DebugList,
           m.OwnerGone,
           # A workspace sync's questions and switch, and the few chunks of an edit (bigger transfers
           # go down a tree of their own: WsChunks' forward list, each host acknowledging itself).
           wm.WsMissing, wm.WsCommit, wm.WsUnmount, wm.WsChunks)
#: A tree deeper than this many items per message, or wider than this degree, is refused.
_MAX_ITEMS = 1 << 16
_MAX_DEGREE = 256
#: How long telling the hosts below that an owner is gone may take.
_OWNER_GONE_S = 30.0
#: The longest deadline a fan-out may ask for (seconds).
_MAX_TIMEOUT_S = 24 * 3600.0
#: How long a stopping agent waits for the fan-outs that carried its Shutdown to send their answers up.
_SHUTDOWN_FLUSH_S = 3.0


class FanoutService(Service):
    """Forwards fan-outs down the tree and their answers up."""

    name = "fanout"
    blocking = False  # forwarding is a few sends: done on the IO thread, in arrival order

    def __init__(self, agent: Any):
        super().__init__(agent)
        self.active = 0
        self.forwarded = 0
        #: Owner -> the hosts this agent forwarded its runs to, {addr: host}: told when it is gone.
        self.below: dict[str, dict[str, str]] = {}
        #: Fan-outs whose own message is this agent's Shutdown and that have not sent every answer up:
        #: the agent's stop waits for them, else its own answer (and its subtree's) dies with it.
        self._stopping = 0
        self._stopping_done = threading.Condition()

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {m.Fanout: self.on_fanout, m.OwnerGone: self.on_owner_gone}

    def owner_lost(self, owner: str) -> None:
        """An owner whose runs went through here is gone: every host below hears it (one fan-out)."""
        below = self.below.pop(owner, None)
        if below:
            fan_out(self.agent.rt, [(addr, host, m.OwnerGone(owner)) for addr, host in below.items()],
                    timeout_s=_OWNER_GONE_S, direct=False)

    def on_owner_gone(self, msg: m.OwnerGone) -> None:
        # Whoever sent it told the whole subtree: not again from here.
        self.below.pop(msg.owner, None)
        self.agent.owner_gone(msg.owner)

    def info(self) -> dict:
        return {"active": self.active, "forwarded": self.forwarded}

    def on_fanout(self, msg: m.Fanout) -> None:
        why = _invalid(msg)
        if why:
            log.warning("refused a fan-out: %s", why)
            return
        agent = self.agent
        parent = msg.reply

        def report(results: dict) -> None:
            agent.send(parent.addr, m.Reply(parent.port_id, 0, True, results))

        carries_stop = type(msg.items[0][3]) is m.Shutdown

        def done() -> None:
            self.active -= 1
            if carries_stop:
                with self._stopping_done:
                    self._stopping -= 1
                    self._stopping_done.notify_all()

        report({})  # at once: the parent hears that this agent carries fan-outs (see Node._check_ack)
        items = msg.items
        if agent.keys.role != CLIENT and len(items) > 1:
            # Without the client's key (a pod's agent) its forwards would be refused: the parent sends them.
            report({it[0]: CANNOT_FORWARD for it in items[1:]})
            items = items[:1]
        own = items[0][3]
        if type(own) is m.RunCommand and own.owner:
            agent.track_owner_via(own.owner, parent.addr)
            if len(items) > 1:
                self.below.setdefault(own.owner, {}).update((addr, host) for _, addr, host, _ in items[1:])
        timeout = None if msg.timeout_s is None else min(float(msg.timeout_s), _MAX_TIMEOUT_S)
        node = Node(agent.rt, items, msg.degree, timeout, report, done, local=self._local)
        self.active += 1
        if carries_stop:
            with self._stopping_done:
                self._stopping += 1
        self.forwarded += len(items) - 1
        node.start()

    def stop(self, deadline: float) -> None:
        # A Shutdown's answer goes up from the IO thread after the agent has been asked to stop; the
        # stop closes that thread's sockets, so it first lets those answers leave (bounded).
        wait = min(deadline, time.monotonic() + _SHUTDOWN_FLUSH_S) - time.monotonic()
        with self._stopping_done:
            if not self._stopping_done.wait_for(lambda: self._stopping <= 0, timeout=max(0.0, wait)):
                log.warning("stopping with %d fan-outs of the Shutdown still answering", self._stopping)

    def _local(self, msg: Any) -> None:
        # Through the runtime, as any message to this agent: the handler runs where it always does
        # (its service's worker), in order with the others.
        self.agent.rt.send(self.agent.rt.addr, msg)


def _invalid(msg: m.Fanout) -> str:
    """Why ``msg`` is not a fan-out this agent carries out ('' when it is)."""
    if not isinstance(msg.reply, m.PortRef) or not msg.reply.addr:
        return "no answer port"
    if type(msg.degree) is not int or not 1 <= msg.degree <= _MAX_DEGREE:
        return f"degree {msg.degree!r}"
    if msg.timeout_s is not None and (type(msg.timeout_s) not in (int, float) or msg.timeout_s < 0):
        return f"timeout {msg.timeout_s!r}"
    if type(msg.items) is not list or not 1 <= len(msg.items) <= _MAX_ITEMS:
        return "no items"
    seen = set()
    for it in msg.items:
        if type(it) is not tuple or len(it) != 4:
            return "an item is not (index, addr, host, message)"
        index, addr, host, inner = it
        if type(index) is not int or index in seen or type(addr) is not str or type(host) is not str:
            return "an item's index, address or host"
        seen.add(index)
        if type(inner) not in CARRIED:
            return f"{type(inner).__name__} is not carried by a fan-out"
    return ""

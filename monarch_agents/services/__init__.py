"""What a host agent does, one service per capability: the interface they all share.

A service is a class with a ``name``, the message types it handles, what it adds to
``monarch status``, and how it stops.  The host agent (``monarch_agents.host_agent``)
builds one of each listed in its ``SERVICES``, registers their handlers, asks each
for :meth:`Service.info` when pinged, and on shutdown calls :meth:`Service.stop` in
the reverse of that order, all against one deadline, before it closes its sockets
and exits normally.

Adding a service (the workspace mount, telemetry tables, debug sessions)::

    # monarch_agents/services/telemetry.py
    class TelemetryService(Service):
        name = "telemetry"

        def handlers(self):
            return {m.Query: self.on_query}

        def info(self):
            return {"rows": self.rows}

        def stop(self, deadline):
            self.flush()

    # monarch_agents/host_agent.py: one more line in SERVICES
    telemetry.TelemetryService,

A service's handlers run in message order on the service's own worker thread
(:attr:`Service.blocking`), never on the IO thread, so they may read files,
fork and wait for locks.  A service that answers within microseconds and wants
no thread hop sets ``blocking = False``.  Children a service starts go through
:meth:`HostAgent.start_child` with a :class:`Child` that hears when the child
started, failed to start, and exited; a child whose owner dies is killed by the
agent, whatever service started it.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, ClassVar

if TYPE_CHECKING:
    from monarch_agents.host_agent import HostAgent

log = logging.getLogger("monarch.host_agent")


class Service:
    """One capability of the host agent (see the module docstring)."""

    #: The key of :meth:`info` in ``HostInfo.services`` (and the worker thread's name).
    name: ClassVar[str] = ""
    #: Handlers run on this service's own worker thread, in message order (True), or on the IO thread.
    blocking: ClassVar[bool] = True
    #: Message types that procs of this host (user code) may send too; every other one is the client's
    #: alone (procs hold no client key: see ``monarch_agents.keys``).
    from_local_procs: ClassVar[frozenset] = frozenset()

    def __init__(self, agent: "HostAgent"):
        self.agent = agent

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        """The message types this service handles, and the method handling each."""
        return {}

    def info(self) -> dict:
        """What this service adds to ``monarch status`` (a small, picklable dict)."""
        return {}

    def stop(self, deadline: float) -> None:
        """Stop everything this service runs by ``deadline`` (``time.monotonic()`` seconds)."""

    def owner_lost(self, owner: str) -> None:
        """An owner (a client) is gone; the agent reaps its children itself (default: nothing more)."""

    def place(self, cwd: str | None, env: dict) -> tuple[str | None, dict]:
        """Where a child starts and its environment, as this service would have them (default: unchanged)."""
        return cwd, env


class Child:
    """A process a service started through the agent's zygote; the agent calls these hooks.

    ``on_started`` and ``on_exited`` run on the agent's zygote-events thread.
    """

    def __init__(self, kind: str, owner: str, orphan_s: float | None = 0.0):
        self.kind = kind
        self.owner = owner
        #: How long it outlives its owner once the owner is gone (0: at once; None: it is not reaped).
        self.orphan_s = orphan_s
        self.pid = 0
        self.exited: tuple[int | None, str] | None = None

    def on_started(self, pid: int) -> None:
        """The zygote forked it; it leads its own process group."""

    def on_failed(self, error: str) -> None:
        """The zygote could not start it (no ``on_exited`` follows)."""

    def on_exited(self, code: int | None, reason: str) -> None:
        """It exited: ``code`` is negative for a signal; ``reason`` in words."""


class SerialWorker:
    """One thread running submitted calls in order: a service's handlers, off the IO thread."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[Any], None], arg: Any) -> None:
        self._queue.put((fn, arg))

    def close(self, deadline: float) -> None:
        """Finish what was submitted (until ``deadline``), then end the thread."""
        self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(max(0.0, deadline - time.monotonic()))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, arg = item
            try:
                fn(arg)
            except Exception:
                log.exception("%s failed on %s", getattr(fn, "__qualname__", fn), type(arg).__name__)


def killpg(pid: int, sig: int) -> None:
    """Signal ``pid``'s process group (or ``pid`` alone); a process already gone is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_children(agent: "HostAgent", children: list[Child], deadline: float, kill_after: float) -> None:
    """SIGTERM ``children``, SIGKILL those still running after ``kill_after`` seconds (or at ``deadline``).

    Returns once all have exited, or at ``deadline``.
    """
    running = [c for c in children if c.pid and c.exited is None]
    for c in running:
        killpg(c.pid, signal.SIGTERM)
    if not running:
        return
    force_at = min(deadline, time.monotonic() + kill_after)
    if not agent.wait_exited(running, force_at):
        for c in running:
            if c.exited is None:
                killpg(c.pid, signal.SIGKILL)
        agent.wait_exited(running, deadline)

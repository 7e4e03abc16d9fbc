"""Where failures go: to the owning actor's ``__supervise__``, or to the root.

A mesh's owner registers here when it creates the mesh.  When a proc of the
mesh dies (the runtime learns it from the host agent or from a closed
connection), or an actor of it fails, the failure goes to the actor that
created the mesh, through its mailbox, in order with its messages.  A mesh made
by the client itself has no such actor: the failure goes to the root hook the
caller names (the client's ``monarch.actor.unhandled_fault_hook``; by default
:func:`default_fault_hook`, which, as Monarch's, ends the client).  Calls to
the failed ranks raise ``SupervisionError`` either way.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable

from monarch_agents import messages as m
from monarch_agents import runtime
from monarch_agents.context import ActorSlotInfo
from monarch_agents.errors import MeshFailure, SupervisionError

_lock = threading.Lock()
_actor_watchers: dict[str, Callable[[m.ActorFailed], None]] = {}


def default_fault_hook(failure: MeshFailure) -> None:
    """Leave the failure unhandled: the client ends, as Monarch's default does (``sys.exit(1)``).

    Raising makes the failure unhandled (see :func:`report`): it is written on stderr and the
    client's main thread gets a KeyboardInterrupt, so the interpreter finalizes there and
    ``atexit`` handlers run.  Set ``monarch.actor.unhandled_fault_hook`` to a function that returns
    to keep the client running (the failed ranks then raise ``SupervisionError`` when called).
    """
    sys.exit(1)


def report(owner: ActorSlotInfo | None, failure: MeshFailure, root: Callable[[MeshFailure], None]) -> None:
    """Hand ``failure`` to ``owner`` (an actor) or, with no owning actor, to ``root`` (the client's hook).

    Nothing is reported while this process's runtime is stopping: deaths it causes itself are expected.
    """
    rt = runtime.current()
    if rt is not None and rt.stopping:
        return
    if owner is not None and owner.slot is not None:
        owner.slot.post(failure)
        return
    try:
        root(failure)
    except BaseException as e:  # noqa: B036 - a hook's sys.exit() (SystemExit) means "unhandled" too
        _unhandled(failure, e)


_interrupted = False

#: Whether a failure no one handled ends this process: a client's, as Monarch's does.  A proc's
#: (a mesh its actor made outside any actor's context, say from a thread of its own) is written on
#: stderr and the proc goes on, as torchmonarch 0.7.0's procs do: ending it would take its actors,
#: and with them its owner's calls, along.  ``proc_agent.main`` sets it False.
ends_process = True


def _unhandled(failure: MeshFailure, why: BaseException) -> None:
    """The root hook raised: the fault is unhandled, and the client ends as Monarch's does.

    Monarch delivers a KeyboardInterrupt to the main thread (only there can the interpreter
    finalize: ``atexit`` handlers and destructors run), after writing the failure on stderr.
    The hook runs on a runtime thread, where its ``SystemExit`` would only end that thread.
    """
    global _interrupted
    if not ends_process:
        print(f"monarch: a failure no one handled in this proc (host {socket.gethostname()}, pid {os.getpid()}, "
              f"{time.strftime('%Y-%m-%d %H:%M:%S')}; the unhandled_fault_hook raised {why!r}); the proc goes on:\n"
              f"{failure.report()}", file=sys.stderr, flush=True)
        return
    print(f"monarch: a failure no one handled ends this client (host {socket.gethostname()}, pid {os.getpid()}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}; the unhandled_fault_hook raised {why!r}):\n{failure.report()}",
          file=sys.stderr, flush=True)
    with _lock:
        if _interrupted:
            return  # one interrupt: a second would break into the exit the first began
        _interrupted = True
    main = threading.main_thread()
    if callable(signal.getsignal(signal.SIGINT)):
        # A real signal to the main thread also wakes it from a blocking sleep, wait or lock.
        signal.pthread_kill(main.ident, signal.SIGINT)
    else:
        # SIGINT is ignored (or left to the OS) here: nothing would reach Python, so end the process.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def ended_by_fault() -> bool:
    """Whether this client's main thread was interrupted because a failure went unhandled."""
    return _interrupted


def watch_actor(actor_id: str, fn: Callable[[m.ActorFailed], None]) -> None:
    with _lock:
        _actor_watchers[actor_id] = fn


def unwatch_actor(actor_id: str) -> None:
    with _lock:
        _actor_watchers.pop(actor_id, None)


def _on_actor_failed(msg: m.ActorFailed) -> None:
    with _lock:
        fn = _actor_watchers.get(msg.actor_id)
    if fn is not None:
        fn(msg)


def install(rt: Any) -> None:
    rt.register(m.ActorFailed, _on_actor_failed)

    def on_proc_stopping(msg: m.ProcStopping) -> None:
        rt.retire(msg.addr, SupervisionError("actor mesh is stopped due to proc mesh shutdown "
                                             f"(the proc at {msg.addr} was stopped by its owner)"))
    rt.register(m.ProcStopping, on_proc_stopping)

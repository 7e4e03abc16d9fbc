"""One background asyncio loop per process on which Monarch-style tasks run.

PyTorch Monarch drives a ``Future`` made from a coroutine, and its ``PythonTask``s, on its Tokio
runtime: a coroutine started there runs beside the caller's code, whatever thread or event loop the
caller is on.  This loop plays that part here: ``submit`` runs a coroutine on it, and code running
on it must not block waiting for another coroutine that needs the same loop (``on_runner`` says
whether the caller is there, so such a wait can refuse instead of hanging).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any, Coroutine

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid = 0


def loop() -> asyncio.AbstractEventLoop:
    """The runner loop, started on first use (and again in a forked child, which has no thread of it)."""
    global _loop, _thread, _pid
    with _lock:
        if _loop is None or _pid != os.getpid():
            new = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(new)
                new.call_soon(started.set)
                new.run_forever()

            _thread = threading.Thread(target=run, name="monarch-tasks", daemon=True)
            _thread.start()
            started.wait()
            _loop, _pid = new, os.getpid()
        return _loop


def on_runner() -> bool:
    """Whether the calling thread is the runner loop's (where waiting for a task would deadlock)."""
    return _thread is not None and threading.current_thread() is _thread and _pid == os.getpid()


def submit(coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
    """Run ``coro`` on the runner loop, in a copy of the caller's context (so ``context()`` is the same)."""
    return asyncio.run_coroutine_threadsafe(coro, loop())

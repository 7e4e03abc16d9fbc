"""Actor classes for the tests, in an importable module: they travel by reference.

(Classes defined in a script's ``__main__`` travel by value; the script tests
cover that.)  Procs import this module as ``tests.monarch.actors``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

from monarch.actor import (
    Actor,
    Channel,
    ValueMesh,
    concurrent_endpoint,
    context,
    current_rank,
    current_size,
    endpoint,
    this_host,
)

class Worker(Actor):
    """A sync actor that does a bit of everything."""

    def __init__(self, tag: str = "w", cleanup_port=None, cleanup_file: str | None = None):
        self.tag = tag
        self.log: list = []
        self.held = None
        self.cleanup_port = cleanup_port
        self.cleanup_file = cleanup_file

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def loaded(self, module: str) -> bool:
        """Whether ``module`` was imported in this proc (before it, in its zygote, counts)."""
        return module in sys.modules

    @endpoint
    def echo(self, value):
        return value

    @endpoint
    def add(self, a, b=0):
        return a + b

    @endpoint
    def where(self) -> tuple:
        """(rank in the messaged slice, sizes of that slice)."""
        return current_rank().rank, current_size()

    @endpoint
    def point(self) -> dict:
        return dict(current_rank())

    @endpoint
    def whoami(self) -> dict:
        ctx = context()
        inst = ctx.actor_instance
        return {"name": inst.name, "actor_rank": inst.rank.rank, "message_rank": ctx.message_rank.rank,
                "class_name": inst.class_name, "pid": os.getpid(), "module": type(self).__module__,
                "module_file": __file__}

    @endpoint
    def record(self, value) -> int:
        self.log.append(value)
        return len(self.log)

    @endpoint
    def records(self) -> list:
        return list(self.log)

    @endpoint
    def fail(self, message: str = "kaboom"):
        raise ValueError(message)

    @endpoint
    def exit(self, code: int):
        os._exit(code)

    @endpoint
    def threads(self) -> list:
        import threading

        return sorted(t.name for t in threading.enumerate())

    @endpoint
    def kill_self(self):
        os.kill(os.getpid(), signal.SIGKILL)

    @endpoint(explicit_response_port=True)
    def hold(self, port, value=None):
        """Answer later: :meth:`release` sends the answer (so a test controls when it arrives)."""
        self.held = (port, value if value is not None else current_rank().rank)

    @endpoint
    def release(self) -> bool:
        port, value = self.held
        self.held = None
        port.send(value)
        return True

    @endpoint(explicit_response_port=True)
    def twice(self, port, x):
        port.send(2 * x)

    @endpoint(explicit_response_port=True)
    def refuse(self, port, message: str):
        port.exception(KeyError(message))

    @endpoint
    def send_to(self, port, values: list) -> int:
        for v in values:
            port.send(v)
        return len(values)

    @endpoint
    def call_other(self, other, *args) -> list:
        """Call another actor mesh (passed in as an argument) from inside this actor."""
        return other.add.call(*args).get(timeout=30).values()

    @endpoint
    def spawn_nested(self, n: int) -> list:
        """Start procs and actors of its own; returns their pids."""
        self.nested_procs = this_host().spawn_procs(per_host={"gpus": n})
        self.nested = self.nested_procs.spawn("nested", Worker, "nested")
        return self.nested.pid.call().get(timeout=30).values()

    @endpoint
    def nested_call(self, x) -> list:
        return self.nested.add.call(x, 1).get(timeout=30).values()

    @endpoint
    def stop_nested(self) -> None:
        self.nested_procs.stop().get(timeout=30)

    @endpoint
    def channel_roundtrip(self, values: list) -> list:
        """Open a channel inside the actor, send to it, receive back."""
        port, recv = Channel.open()
        for v in values:
            port.send(v)
        return [recv.recv().get(timeout=10) for _ in values]

    def __cleanup__(self, exc):
        if self.cleanup_file:
            with open(self.cleanup_file, "a") as f:
                f.write(f"{self.tag}:{os.getpid()}\n")
        if self.cleanup_port is not None:
            self.cleanup_port.send(("cleanup", self.tag, os.getpid()))


def _fail_line() -> int:
    import inspect

    src, start = inspect.getsourcelines(Worker.__dict__["fail"].fn)
    return start + next(i for i, line in enumerate(src) if "raise ValueError" in line)


#: The line of the ``raise`` in :meth:`Worker.fail` (tests look for it in remote tracebacks).
FAIL_LINE = _fail_line()


class AsyncWorker(Actor):
    """An async actor: every endpoint is ``async def``."""

    def __init__(self, cleanup_port=None):
        self.log: list = []
        self.cleanup_port = cleanup_port
        self.gate: asyncio.Event | None = None

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def add(self, a, b=0):
        await asyncio.sleep(0)
        return a + b

    @endpoint
    async def where(self) -> tuple:
        return current_rank().rank, current_size()

    @endpoint
    async def record(self, value) -> int:
        await asyncio.sleep(0)
        self.log.append(value)
        return len(self.log)

    @endpoint
    async def records(self) -> list:
        return list(self.log)

    @endpoint
    async def fail(self):
        raise RuntimeError("async kaboom")

    @endpoint
    async def call_other(self, other, *args) -> list:
        vm = await other.add.call(*args)
        return vm.values()

    @concurrent_endpoint
    async def wait_gate(self) -> str:
        if self.gate is None:
            self.gate = asyncio.Event()
        await self.gate.wait()
        return "opened"

    @concurrent_endpoint
    async def open_gate(self) -> bool:
        if self.gate is None:
            self.gate = asyncio.Event()
        self.gate.set()
        return True

    async def __cleanup__(self, exc):
        if self.cleanup_port is not None:
            self.cleanup_port.send(("cleanup", "async", os.getpid()))


class Mixed(Actor):
    @endpoint
    def a(self):
        return 1

    @endpoint
    async def b(self):
        return 2


class BadInit(Actor):
    def __init__(self, bad_rank: int | None = None):
        if bad_rank is None or current_rank().rank == bad_rank:
            raise RuntimeError(f"cannot start rank {current_rank().rank}")

    @endpoint
    def ok(self):
        return True


class Owner(Actor):
    """Owns a nested mesh; reports each failure it supervises on ``port``."""

    def __init__(self, port, handle: bool = True):
        self.port = port
        self.handle = handle
        self.failures: list = []

    @endpoint
    def start(self, n: int) -> list:
        self.procs = this_host().spawn_procs(per_host={"gpus": n})
        self.kids = self.procs.spawn("kids", Worker, "kid")
        return self.kids.pid.call().get(timeout=30).values()

    @endpoint
    def ask_kid(self, rank: int, x) -> int:
        return self.kids.slice(gpus=rank).add.call_one(x, 1).get(timeout=30)

    @endpoint
    def failures_seen(self) -> list:
        return [(f.mesh_name, f.rank, f.exit_code) for f in self.failures]

    @endpoint
    def ping(self) -> str:
        return "pong"

    @endpoint
    def stop_kids(self) -> None:
        self.procs.stop().get(timeout=30)

    def __supervise__(self, failure) -> bool:
        self.failures.append(failure)
        self.port.send((failure.mesh_name, failure.rank, failure.reason, failure.exit_code))
        return self.handle


class Sleeper(Actor):
    @endpoint
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def mesh_values(vm: ValueMesh) -> list:
    return list(vm.values())


# --- Monarch's actor semantics (tests/monarch/test_monarch_semantics.py) ------------


class GatedInit(Actor):
    """``__init__`` returns once the file ``gate`` exists: calls made meanwhile wait behind it."""

    def __init__(self, gate: str):
        while not os.path.exists(gate):
            time.sleep(0.01)
        self.ready_at = time.monotonic()

    @endpoint
    def ready(self) -> bool:
        return hasattr(self, "ready_at")


class Mortal(Actor):
    """Endpoints that end the actor the ways Monarch says they do."""

    def __init__(self, port=None):
        self.port = port

    @endpoint
    def ok(self) -> str:
        return "ok"

    @endpoint
    def base(self, kind: str):
        if kind == "exit":
            raise SystemExit(3)
        raise KeyboardInterrupt("interrupted on purpose")

    @endpoint(explicit_response_port=True)
    def explicit_raise(self, port, message: str):
        raise ValueError(message)

    @endpoint
    def abort(self, reason: str) -> str:
        context().actor_instance.abort(reason)
        return "not this"

    @endpoint
    def name(self) -> str:
        from monarch.actor import current_actor_name

        return current_actor_name()

    @endpoint
    def log_lines(self, message: str) -> list:
        """Log through ``self.logger`` and return the lines a handler added now prints."""
        import logging

        lines: list = []

        class Keep(logging.Handler):
            def emit(self, record):
                lines.append(self.format(record))

        handler = Keep()
        logging.getLogger().addHandler(handler)
        try:
            self.logger.info(message)
        finally:
            logging.getLogger().removeHandler(handler)
        return lines

    @endpoint
    def env(self, name: str):
        return os.environ.get(name)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint(explicit_response_port=True)
    def ranked(self, port, value):
        port.send(value)

    @endpoint(explicit_response_port=True)
    def answer_with_exception(self, port, message: str):
        port.exception(ValueError(message))

    def plain(self, x: int) -> int:
        """Not an endpoint: only ``as_endpoint(mesh.plain)`` calls it."""
        return x * 10

    def plain_with_port(self, port, x: int) -> None:
        port.send(x * 100)


class Finalizable(Actor):
    """Arms an ``atexit`` handler and a module-level object with ``__del__`` in its proc."""

    @endpoint
    def arm(self, path: str) -> int:
        import atexit

        global _FINALIZER
        atexit.register(_append, path, "atexit")
        _FINALIZER = _Finalizer(path)
        return os.getpid()


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


class _Finalizer:
    def __init__(self, path: str):
        self.path = path

    def __del__(self):
        _append(self.path, "__del__")


_FINALIZER = None


class Foreman(Actor):
    """Spawns actors on procs someone else made; tells ``port`` about each failure it supervises.

    ``busy`` holds its (sync) mailbox so the test can queue messages and a failure behind it.
    """

    def __init__(self, port):
        self.port = port
        self.log: list = []

    @endpoint
    def spawn_on(self, procs) -> list:
        self.workers = procs.spawn("hired", Worker, "hired")
        return self.workers.pid.call().get(timeout=30).values()

    @endpoint
    def spawn_own(self, n: int) -> list:
        self.procs = this_host().spawn_procs(per_host={"gpus": n})
        self.kids = self.procs.spawn("kids", Worker, "kid")
        return self.kids.pid.call().get(timeout=30).values()

    @endpoint
    def busy_until_a_failure_waits(self) -> None:
        """Hold the mailbox until a supervision event is queued behind the messages waiting."""
        self.log.append("busy")
        slot = self._monarch_info.slot
        deadline = time.monotonic() + 30
        while not slot.events and time.monotonic() < deadline:
            time.sleep(0.01)

    @endpoint
    def busy_until_stopping_then_lose_a_kid(self) -> None:
        """Hold the mailbox until a stop has begun, then kill a kid's proc and wait until it is known dead."""
        from monarch_agents.runtime import current

        slot = self._monarch_info.slot
        deadline = time.monotonic() + 30
        while not slot.stopping and time.monotonic() < deadline:
            time.sleep(0.01)
        proc = self.procs._procs[0]
        os.kill(proc.pid, signal.SIGKILL)
        while current().death(proc.addr) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)  # the death watchers run right after it is recorded

    @endpoint
    def note(self, what: str) -> list:
        self.log.append(what)
        return list(self.log)

    def __supervise__(self, failure) -> bool:
        self.log.append("supervise")
        self.port.send((failure.mesh_name, failure.rank, failure.report()))
        return True


class Canceller(Actor):
    """An async actor whose concurrent calls say, in ``__cleanup__``, whether they were cancelled first."""

    def __init__(self, port):
        self.port = port
        self.cancelled = 0
        self.started = 0

    @concurrent_endpoint
    async def forever(self) -> None:
        self.started += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    @concurrent_endpoint
    async def started_count(self) -> int:
        return self.started

    async def __cleanup__(self, exc):
        self.port.send(("cleanup", self.cancelled))


class Counter(Actor):
    """A controller: one per job, whoever asks."""

    def __init__(self, start: int = 0):
        self.n = start

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class ControllerUser(Actor):
    @endpoint
    def use_controller(self) -> tuple:
        from monarch.actor import get_or_spawn_controller

        counter = get_or_spawn_controller("counter", Counter, 100).get(timeout=30)
        return counter.incr.call_one().get(timeout=30), counter.pid.call_one().get(timeout=30)


class Notebook(Actor):
    """Remembers what it is told, in order (tests/monarch/test_early_calls.py)."""

    def __init__(self) -> None:
        self.notes: list = []

    @endpoint
    def remember(self, note: str) -> None:
        self.notes.append(note)

    @endpoint
    def recall(self) -> list:
        return list(self.notes)


class HandMadeSender(Actor):
    """Sends through Monarch's hand-built mailbox objects (``PortRef``, ``PythonMessage``)."""

    def __init__(self, handle: bool = False) -> None:
        self.handle = handle
        self.returned: list = []

    @endpoint
    def send_to(self, addr: str, port: int, value: Any) -> None:
        import pickle

        from monarch._rust_bindings.monarch_hyperactor.actor import PythonMessage, PythonMessageKind
        from monarch._rust_bindings.monarch_hyperactor.buffers import Buffer
        from monarch._rust_bindings.monarch_hyperactor.mailbox import PortId, PortRef
        from monarch._rust_bindings.monarch_hyperactor.proc import ActorAddr

        buf = Buffer()
        buf.write(pickle.dumps(value))
        port_ref = PortRef(PortId(actor_id=ActorAddr(addr=addr, proc_name="p", actor_name="a"), port=port))
        port_ref.send(context().actor_instance._as_rust(), PythonMessage(PythonMessageKind.Result(None), buf.freeze(), []))

    @endpoint
    def seen(self) -> list:
        return self.returned

    def _handle_undeliverable_message(self, message: Any) -> bool:
        if not self.handle:
            return False
        self.returned.append((message.sender(), message.dest(), message.error_msg()))
        return True

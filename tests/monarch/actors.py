"""Actor classes for the tests, in an importable module: they travel by reference.

(Classes defined in a script's ``__main__`` travel by value; the script tests
cover that.)  Procs import this module as ``tests.monarch.actors``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

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

    src, start = inspect.getsourcelines(Worker.__dict__["fail"]._fn)
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

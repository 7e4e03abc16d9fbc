"""The proc agent: a process that hosts actors.

Each actor has its own mailbox and its own thread, so messages to one actor
are handled one at a time, in the order they arrived, and a blocking endpoint
never stalls the IO thread or other actors.  A sync actor (all ``def``
endpoints) runs them directly on that thread; an async actor (all ``async def``)
runs them on an event loop of its own on that thread, awaiting each in turn
(``@concurrent_endpoint`` ones overlap).

An exception in an endpoint goes back to the caller as ``ActorError`` with the
traceback.  A failure no one handles (an exception in a ``broadcast``, or a
``__supervise__`` that returns False) fails the actor: its owner is told, and
every later message to it is answered with ``SupervisionError``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import queue
import signal
import sys
import threading
import traceback
from typing import Any

from monarch_agents import messages as m
from monarch_agents import supervision
from monarch_agents.context import CURRENT, ActorSlotInfo, MessageContext
from monarch_agents.errors import ActorError, MeshFailure, SupervisionError
from monarch_agents.ports import Port
from monarch_agents.runtime import Runtime, install
from monarch_agents.transport import JobKeys

log = logging.getLogger("monarch.proc_agent")

_STOP = object()


_specs: dict[tuple[type, str], Any] = {}


def endpoint_spec(cls: type, name: str) -> Any:
    """The endpoint descriptor for ``cls.name``, or None if it is not an endpoint."""
    key = (cls, name)
    try:
        return _specs[key]
    except KeyError:
        pass
    # getattr_static walks the MRO in Python: once per class and name, not once per message.
    desc = inspect.getattr_static(cls, name, None)
    desc = desc if getattr(desc, "_is_monarch_endpoint", False) else None
    if len(_specs) < 100_000:
        _specs[key] = desc
    return desc


def actor_kind(cls: type) -> str:
    """"sync" or "async"; raises ValueError when a class mixes both kinds of endpoint."""
    kinds = set()
    for name in dir(cls):
        desc = endpoint_spec(cls, name)
        if desc is not None:
            kinds.add("async" if inspect.iscoroutinefunction(desc._fn) else "sync")
    if len(kinds) > 1:
        raise ValueError(f"{cls.__name__} mixes both async and sync endpoints; make them all `def` or all `async def`")
    return kinds.pop() if kinds else "sync"


class ActorSlot:
    """One actor: its instance, mailbox and thread."""

    def __init__(self, agent: "ProcAgent", msg: m.SpawnActor):
        self.agent = agent
        self.msg = msg
        self.info: ActorSlotInfo | None = None
        self.instance: Any = None
        self.kind = "sync"
        self.mailbox: queue.SimpleQueue = queue.SimpleQueue()
        self.failed: SupervisionError | None = None
        self.stopped = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, name=f"actor-{msg.name}", daemon=True)

    # -- thread --------------------------------------------------------------

    def _run(self) -> None:
        if not self._construct():
            return
        if self.kind == "async":
            asyncio.run(self._run_async())
        else:
            while True:
                item = self.mailbox.get()
                if item is _STOP or self._handle_sync(item):
                    return

    def _construct(self) -> bool:
        msg = self.msg
        rt = self.agent.rt
        try:
            cls, args, kwargs = msg.payload.load()
            self.kind = actor_kind(cls)
            self.info = ActorSlotInfo(msg.actor_id, msg.name, cls.__name__, msg.point, msg.extent,
                                      _linear(msg.point, msg.extent), rt.host, rt.addr, msg.owner, self)
            token = CURRENT.set(MessageContext(self.info, msg.point, msg.extent, self.info.rank))
            try:
                instance = cls.__new__(cls)
                instance._monarch_slot = self.info
                if self.kind == "async":
                    # Async constructors are rare; run __init__ plainly either way.
                    pass
                instance.__init__(*args, **kwargs)
            finally:
                CURRENT.reset(token)
            self.instance = instance
        except BaseException as e:
            self.agent.send_reply(msg.reply, self._actor_error(e, "__init__"), ok=False, rank=self.info.rank if self.info else 0)
            self.agent.forget(msg.actor_id)
            return False
        self.agent.send_reply(msg.reply, True, rank=self.info.rank)
        return True

    async def _run_async(self) -> None:
        self.loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        self._aqueue = q

        def pump() -> None:
            # Bridge the thread-safe mailbox into the loop without polling.
            while True:
                item = self.mailbox.get()
                if item is _STOP:  # posted below once the loop is done
                    return
                try:
                    self.loop.call_soon_threadsafe(q.put_nowait, item)
                except RuntimeError:  # the loop closed: the actor was stopped
                    return

        threading.Thread(target=pump, name=f"actor-{self.msg.name}-pump", daemon=True).start()
        tasks: set[asyncio.Task] = set()
        while True:
            item = await q.get()
            if item is _STOP:
                break
            if isinstance(item, m.Call) and self._is_concurrent(item.method):
                t = asyncio.ensure_future(self._handle_async(item))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                continue
            if await self._handle_async(item):
                break
        for t in tasks:
            t.cancel()
        self.mailbox.put(_STOP)  # or the pump thread would wait for a message forever

    def _is_concurrent(self, method: str) -> bool:
        desc = endpoint_spec(type(self.instance), method)
        return bool(desc is not None and desc._concurrent)

    # -- messages --------------------------------------------------------------

    def _prepare(self, call: m.Call) -> tuple[Any, tuple, dict, Any]:
        desc = endpoint_spec(type(self.instance), call.method)
        if desc is None:
            raise AttributeError(f"{type(self.instance).__name__}.{call.method} is not an endpoint")
        args, kwargs = call.payload.load()
        fn = desc._fn.__get__(self.instance)
        if desc._explicit_response_port:
            port = Port(call.reply, call.rank) if call.reply is not None else _NullPort()
            args = (port, *args)
        return fn, args, kwargs, desc

    def _handle_sync(self, item: Any) -> bool:
        """Handle one mailbox item; True when the actor should stop."""
        if isinstance(item, m.Call):
            if self._refuse(item):
                return False
            token = CURRENT.set(MessageContext(self.info, item.point, item.extent, item.rank))
            try:
                fn, args, kwargs, desc = self._prepare(item)
                result = fn(*args, **kwargs)
            except BaseException as e:
                self._failed_call(item, e)
            else:
                if not desc._explicit_response_port:
                    self._answer(item, result)
            finally:
                CURRENT.reset(token)
            return False
        if isinstance(item, MeshFailure):
            self._supervise(lambda: self.instance.__supervise__(item), item)
            return False
        if isinstance(item, m.StopActor):
            self._cleanup_sync(None)
            self.agent.send_reply(item.reply, True, rank=item.rank)
            return True
        return False

    async def _handle_async(self, item: Any) -> bool:
        if isinstance(item, m.Call):
            if self._refuse(item):
                return False
            token = CURRENT.set(MessageContext(self.info, item.point, item.extent, item.rank))
            try:
                fn, args, kwargs, desc = self._prepare(item)
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
            except BaseException as e:
                if isinstance(e, asyncio.CancelledError):
                    # A concurrent call cut short by a stop: its caller must not wait forever.
                    if item.reply is not None:
                        err = SupervisionError(f"actor {self.msg.name!r} was stopped during {item.method}",
                                               actor=self.msg.name, rank=item.rank, host=self.agent.rt.host)
                        self.agent.send_reply(item.reply, err, ok=False, rank=item.rank)
                    raise
                self._failed_call(item, e)
            else:
                if not desc._explicit_response_port:
                    self._answer(item, result)
            finally:
                CURRENT.reset(token)
            return False
        if isinstance(item, MeshFailure):
            async def sup() -> Any:
                r = self.instance.__supervise__(item)
                return (await r) if inspect.isawaitable(r) else r
            try:
                handled = await sup()
            except BaseException as e:
                handled = False
                log.error("__supervise__ raised: %s", e)
            self._after_supervise(handled, item)
            return False
        if isinstance(item, m.StopActor):
            cleanup = getattr(self.instance, "__cleanup__", None)
            if cleanup is not None:
                try:
                    r = cleanup(None)
                    if inspect.isawaitable(r):
                        await r
                except Exception:
                    log.exception("__cleanup__ failed")
            self.agent.send_reply(item.reply, True, rank=item.rank)
            return True
        return False

    def _refuse(self, call: m.Call) -> bool:
        if self.failed is None:
            return False
        if call.reply is not None:
            self.agent.send_reply(call.reply, self.failed, ok=False, rank=call.rank)
        return True

    def _answer(self, call: m.Call, result: Any) -> None:
        if call.reply is None:
            return
        try:
            payload = m.Pickled.of(result)
        except Exception as e:
            self._failed_call(call, TypeError(f"the result of {call.method} could not be pickled: {e}"))
            return
        self.agent.send_reply(call.reply, payload, rank=call.rank)

    def _failed_call(self, call: m.Call, e: BaseException) -> None:
        err = self._actor_error(e, call.method)
        if call.reply is not None:
            self.agent.send_reply(call.reply, err, ok=False, rank=call.rank)
        else:
            # Nobody is waiting for this answer: the failure becomes the actor's.
            self._fail(f"endpoint {call.method} raised with no caller to tell: {type(e).__name__}: {e}")

    def _actor_error(self, e: BaseException, method: str) -> m.Pickled:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        name = self.msg.name
        rank = self.info.rank if self.info else None
        host = self.agent.rt.host
        err = ActorError(e, tb, actor=f"{name}.{method}", rank=rank, host=host)
        try:
            return m.Pickled.of(err)
        except Exception:
            return m.Pickled.of(ActorError(None, tb, actor=f"{name}.{method}", rank=rank, host=host,
                                           message=f"{type(e).__name__}: {e}"))

    def _supervise(self, fn: Any, failure: MeshFailure) -> None:
        try:
            handled = fn() if hasattr(self.instance, "__supervise__") else False
        except BaseException as e:
            log.error("__supervise__ raised: %s", e)
            handled = False
        self._after_supervise(handled, failure)

    def _after_supervise(self, handled: Any, failure: MeshFailure) -> None:
        if not handled:
            self._fail(f"unhandled failure in a mesh it owns: {failure.report}")

    def _fail(self, reason: str) -> None:
        if self.failed is not None:
            return
        info = self.info
        self.failed = SupervisionError(f"actor {self.msg.name!r} rank {info.rank if info else '?'} on {self.agent.rt.host} failed: {reason}",
                                       actor=self.msg.name, rank=info.rank if info else None, host=self.agent.rt.host)
        try:
            self.agent.rt.send(self.msg.owner, m.ActorFailed(self.agent.rt.addr, self.msg.actor_id,
                                                             info.rank if info else 0, self.agent.rt.host, reason))
        except Exception:
            pass

    def _cleanup_sync(self, exc: Exception | None) -> None:
        cleanup = getattr(self.instance, "__cleanup__", None)
        if cleanup is None:
            return
        try:
            cleanup(exc)
        except Exception:
            log.exception("__cleanup__ failed")

    def post(self, item: Any) -> None:
        self.mailbox.put(item)


class _NullPort:
    def send(self, value: Any) -> None:
        pass

    def exception(self, exc: BaseException) -> None:
        pass


def _linear(point: dict, extent: dict) -> int:
    r = 0
    for k, size in extent.items():
        r = r * size + point.get(k, 0)
    return r


class ProcAgent:
    def __init__(self, rt: Runtime, config: dict):
        self.rt = rt
        self.config = config
        self.actors: dict[str, ActorSlot] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def on_spawn(self, msg: m.SpawnActor) -> None:
        slot = ActorSlot(self, msg)
        with self.lock:
            self.actors[msg.actor_id] = slot
        slot.thread.start()

    def forget(self, actor_id: str) -> None:
        with self.lock:
            self.actors.pop(actor_id, None)

    def on_call(self, msg: m.Call) -> None:
        slot = self.actors.get(msg.actor_id)
        if slot is None:
            if msg.reply is not None:
                self.send_reply(msg.reply, SupervisionError(f"no actor {msg.actor_id!r} on this proc (it was stopped or never started)"),
                                ok=False, rank=msg.rank)
            return
        slot.post(msg)

    def on_stop_actor(self, msg: m.StopActor) -> None:
        with self.lock:
            slot = self.actors.pop(msg.actor_id, None)
        if slot is None:
            self.send_reply(msg.reply, True, rank=msg.rank)
            return
        slot.post(msg)

    def on_stop_proc(self, msg: m.StopProc) -> None:
        threading.Thread(target=self._stop_all, args=(msg,), daemon=True).start()

    def _stop_all(self, msg: m.StopProc) -> None:
        from monarch_agents.future import Future
        from monarch_agents.runtime import OneShot

        with self.lock:
            slots, self.actors = list(self.actors.values()), {}
        futs = []
        for s in slots:
            f: Future = Future()
            port = self.rt.open_port(OneShot(self.rt, f))
            s.post(m.StopActor(s.msg.actor_id, port))
            futs.append(f)
        for f in futs:
            try:
                f.get(timeout=5)
            except Exception:
                pass
        if msg.reply is not None:
            self.send_reply(msg.reply, True)
        self.stopped.set()

    def send_reply(self, port: m.PortRef, value: Any, ok: bool = True, rank: int = 0) -> None:
        try:
            self.rt.send(port.addr, m.Reply(port.port_id, rank, ok, value))
        except Exception as e:
            log.debug("could not answer %s: %s", port, e)

    def supervise(self, slot_info: ActorSlotInfo, failure: MeshFailure) -> None:
        slot = slot_info.slot
        if isinstance(slot, ActorSlot):
            slot.post(failure)


_agent: ProcAgent | None = None


def current_agent() -> ProcAgent | None:
    return _agent


def main(config: dict) -> None:
    """Entry point in a freshly forked proc (called by the zygote)."""
    global _agent
    logging.basicConfig(level=os.environ.get("MONARCH_LOG", "WARNING"))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    keys = JobKeys(**config["keys"])
    # The zygote's sys.path was fixed when it started; put the spawner's own entries (its
    # script's directory, say) first, in its order, so its modules import here by name too.
    extra = [p for p in os.environ.get("MONARCH_SYS_PATH", "").split(os.pathsep) if p]
    sys.path[:0] = [p for p in extra if p not in sys.path]
    os.environ["MONARCH_HOST_AGENT"] = config["host_agent"]
    os.environ["MONARCH_HOST_RANK"] = str(config["host_rank"])
    rt = install(Runtime(keys, bind_host=config["bind_host"], name=f"proc[{config['mesh_id']}]", host=config["host"]))
    agent = _agent = ProcAgent(rt, config)
    rt.register(m.SpawnActor, agent.on_spawn)
    rt.register(m.Call, agent.on_call)
    rt.register(m.StopActor, agent.on_stop_actor)
    rt.register(m.StopProc, agent.on_stop_proc)
    supervision.install(rt)
    rt.start()
    rt.send(config["host_agent"], m.ProcReady(config["token"], rt.addr, os.getpid()))
    agent.stopped.wait()
    rt.close()

"""The proc agent: a process that hosts actors.

Each actor has its own mailbox and its own thread, so messages to one actor
are handled one at a time, in the order they arrived, and a blocking endpoint
never stalls the IO thread or other actors.  A sync actor (all ``def``
endpoints) runs them directly on that thread; an async actor (all ``async def``)
runs them on an event loop of its own on that thread, awaiting each in turn
(``@concurrent_endpoint`` ones overlap).

An ``Exception`` in an endpoint goes back to the caller as ``ActorError`` with
the traceback.  As in Monarch, these fail the actor instead: an ``__init__``
that raises, a ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``) in an
endpoint, an exception no caller waits for (a ``broadcast``, an endpoint that
answers through its own port), a ``__supervise__`` that returns False, and
``Instance.abort()``.  Its owner is told (``__supervise__``, or the client's
``unhandled_fault_hook``), and every later call to it raises
``SupervisionError``.  Supervision events run before messages already queued,
and are dropped once the actor is stopping.  Stopping an actor cancels its
running ``@concurrent_endpoint`` calls, runs ``__cleanup__``, then stops the
meshes it made; stopping the proc then runs ``atexit`` handlers and lets user
modules' objects go (their ``__del__`` runs) before the process exits.
"""

from __future__ import annotations

import atexit
import collections
import gc
import inspect
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from monarch_agents.zygote import ENV_UNSET  # noqa: F401  (re-exported: monarch.actor names it here; the zygote applies it)
from monarch_agents import actor_logging, actor_telemetry, future, supervision
from monarch_agents import messages as m
from monarch_agents.context import CURRENT, ActorSlotInfo, MessageContext
from monarch_agents.endpoints import EndpointProperty, PlainMethod
from monarch_agents.errors import ActorError, MeshFailure, OversizedMessage, SupervisionError, actor_failed_text
from monarch_agents.ports import Port
from monarch_agents.runtime import Runtime, install
from monarch_agents.transport import JobKeys

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("monarch.proc_agent")

_STOP = object()
_WAKE = object()  # a supervision event waits in ``ActorSlot.events``
#: How long stopping waits for each actor (and each mesh an actor made), in seconds, asked at each
#: stop: the API layer (``monarch.actor``) points it at its ``stop_actor_timeout`` setting.
child_stop_s: Callable[[], float] = lambda: 5.0
#: How many stopped actors a proc remembers, to say "stopped" rather than "no such actor".
_GONE_KEPT = 10_000
#: How long a call for an actor this proc has not heard of waits for its spawn: the spawn and the
#: call may come from different processes (an actor spawns a mesh and returns it; its caller calls
#: it), and then the call may arrive first.  Then, and for at most this many actors, it waits.
_EARLY_WAIT_S = 5.0
_EARLY_KEPT = 1_000


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
    desc = desc if isinstance(desc, EndpointProperty) else None
    if len(_specs) < 100_000:
        _specs[key] = desc
    return desc


def actor_kind(cls: type) -> str:
    """"sync" or "async"; raises ValueError when a class mixes both kinds of endpoint."""
    kinds = set()
    for name in dir(cls):
        desc = endpoint_spec(cls, name)
        if desc is not None:
            kinds.add("async" if inspect.iscoroutinefunction(desc.fn) else "sync")
    if len(kinds) > 1:
        raise ValueError(f"{cls.__name__} mixes both async and sync endpoints; make them all `def` or all `async def`")
    has_endpoints = bool(kinds)
    # An actor with no endpoints is an async one, as in Monarch (its __init__ runs on a loop).
    kind = kinds.pop() if kinds else "async"
    # As Monarch: the hooks run where the endpoints do (a sync actor's thread has no event loop,
    # an async actor's cleanup is awaited on its loop), so their kind must match.
    hooks = {h: inspect.iscoroutinefunction(getattr(cls, h)) for h in ("__cleanup__", "__supervise__")
             if callable(getattr(cls, h, None))}
    if kind == "sync" and hooks.get("__cleanup__"):
        raise ValueError(f"{cls} has sync endpoints, but an async __cleanup__. Make sure __cleanup__ is also "
                         "synchronous (a sync actor's thread has no event loop)")
    if has_endpoints and kind == "async" and hooks.get("__cleanup__") is False:
        raise ValueError(f"{cls} has async endpoints, but a synchronous __cleanup__. Make sure __cleanup__ is also "
                         "async (it is awaited on the actor's event loop)")
    if kind == "sync" and hooks.get("__supervise__"):
        raise ValueError(f"{cls} has sync endpoints, but an async __supervise__. Make sure __supervise__ is also "
                         "synchronous (a sync actor's thread has no event loop)")
    return kind


class ActorSlot:
    """One actor: its instance, mailbox and thread."""

    def __init__(self, agent: "ProcAgent", msg: m.SpawnActor):
        self.agent = agent
        self.msg = msg
        self.info: ActorSlotInfo | None = None
        self.instance: Any = None
        self.kind = "sync"
        self.mailbox: queue.SimpleQueue = queue.SimpleQueue()
        #: The IO loop's mailbox while this actor's thread runs it waiting for an item, or while it
        #: sleeps counted among its sleepers (see ``_take``).
        self._polling: Any = None
        self._sleeping: Any = None
        #: An async actor's: while its event loop runs, what ``post`` hands it (straight to the loop),
        #: under ``_post_lock`` (so that nothing overtakes what was queued before); and what stands for
        #: its thread among the IO loop's sleepers.
        self._direct: Callable[[Any], None] | None = None
        self._post_lock = threading.Lock()
        self._async_waiter = _Waiter()
        # Supervision events jump the queue: they run before messages already waiting.
        self.events: collections.deque[MeshFailure] = collections.deque()
        self.failed: SupervisionError | None = None
        #: It never started: its proc was poisoned (calls raise the spawn's RuntimeError).
        self.spawn_refused = False
        self.stopping = False
        #: Why it stopped, when it stopped itself (``Instance.stop``): the Stopped status's reason.
        self.stop_reason: str | None = None
        self.constructing = True  # in __init__: a stop cannot be waited for
        #: Meshes this actor made (anything with ``stop() -> Future``): stopped with it.
        self.children: list[Any] = []
        self.tasks: set["asyncio.Task"] = set()
        self.thread = threading.Thread(target=self._run, name=f"actor-{msg.name}", daemon=True)
        actor_telemetry.created(self)

    @property
    def display_name(self) -> str:
        """How texts name this actor: its mesh name and rank, ``trainers[3]``."""
        rank = self.info.rank if self.info else _linear(self.msg.point, self.msg.extent)
        return f"{self.msg.name}[{rank}]"

    # -- thread --------------------------------------------------------------

    def _run(self) -> None:
        poisoned = self.agent.poisoned
        if poisoned is not None:
            self._refuse_spawn(poisoned)
            self._serve_sync()
            return
        try:
            loaded = self.msg.payload.load()
            kind = actor_kind(loaded[0])
        except BaseException as e:
            loaded, kind = e, "sync"  # _construct reports it
        if kind == "async":
            import asyncio

            # As in Monarch, an async actor's __init__ runs on its event loop (it may start tasks).
            if asyncio.run(self._construct_and_run_async(loaded)):
                return
        else:
            ok = self._construct(loaded)
            self.constructing = False
            if ok:
                self._serve_sync()
                return
        # One whose __init__ failed answers every call with SupervisionError until it is stopped.
        self._serve_sync()

    async def _construct_and_run_async(self, loaded: Any) -> bool:
        """Construct on this loop, then serve; False when __init__ failed (served without a loop)."""
        ok = self._construct(loaded)
        self.constructing = False
        if ok:
            await self._run_async()
        return ok

    def _serve_sync(self) -> None:
        while True:
            item = self._take()
            while self.events and not self.stopping:
                self._supervise_sync(self.events.popleft())
            if item is _WAKE:
                continue
            if item is _STOP or self._handle_sync(item):
                return

    def _take(self) -> Any:
        """The next mailbox item.  With none yet, a proc's actor thread runs the IO loop itself until
        one comes (``Mailbox.run_until``: no hand-over from the IO thread to this one per call);
        otherwise, or when the loop is not free, it sleeps counted among the loop's sleepers."""
        q = self.mailbox
        if q.empty():
            mb = self.agent.rt.mailbox
            if future.process_loop is mb:
                self._polling = mb
                try:
                    mb.run_until(self._has_mail)
                finally:
                    self._polling = None
                if not q.empty():
                    return q.get()
            mb.sleep_begin(self)
            if not q.empty():
                mb.sleep_end(self)
            else:
                try:
                    return q.get()
                finally:
                    mb.sleep_end(self)
        return q.get()

    def _has_mail(self) -> bool:
        return not self.mailbox.empty()

    def _construct(self, loaded: Any) -> bool:
        """``loaded``: the spawn's (class, args, kwargs), or what loading it (or its kind) raised."""
        msg = self.msg
        rt = self.agent.rt
        self.info = ActorSlotInfo(msg.actor_id, msg.name, "", msg.point, msg.extent, _linear(msg.point, msg.extent),
                                  rt.host, rt.addr, msg.owner, self)
        try:
            if isinstance(loaded, BaseException):
                raise loaded
            cls, args, kwargs = loaded
            self.kind = actor_kind(cls)
            self.info.class_name = cls.__name__
            self.info.qualname = _qualname(msg.creator, f"{cls.__module__}.{cls.__qualname__}", msg.name, msg.point, msg.extent)
            token = CURRENT.set(MessageContext(self.info, msg.point, msg.extent, self.info.rank))
            actor_telemetry.status(self, "Initializing")
            try:
                instance = cls.__new__(cls)
                instance._monarch_slot = self.info
                instance.__init__(*args, **kwargs)
            finally:
                CURRENT.reset(token)
            self.instance = instance
        except BaseException as e:
            # As in Monarch, a failed __init__ is a supervision event for the mesh's owner;
            # the actor stays, answering every call with SupervisionError.
            cls_name = self.info.class_name or "the class (it could not be loaded here)"
            self._fail(_failure_reason(f"Actor call {msg.name}.__init__ failed.", e, f"{cls_name}.__init__ raised"))
            f = self.failed
            assert f is not None
            self.agent.send_reply(msg.reply, SupervisionError(f"error spawning actor mesh {msg.name!r}: {f.message}",
                                                              actor=f.actor, rank=f.rank, host=f.host),
                                  ok=False, rank=self.info.rank)
            return False
        actor_telemetry.ready(self)
        self.agent.send_reply(msg.reply, True, rank=self.info.rank)
        return True

    def _refuse_spawn(self, why: str) -> None:
        """This proc is poisoned (Monarch: an actor of it failed): no new actor starts on it.

        As in Monarch the spawn fails for its caller (``initialized`` and every call raise); it is
        not a new failure for the mesh's owner: the one that poisoned the proc was reported.
        """
        msg = self.msg
        rt = self.agent.rt
        self.info = ActorSlotInfo(msg.actor_id, msg.name, "", msg.point, msg.extent, _linear(msg.point, msg.extent),
                                  rt.host, rt.addr, msg.owner, self)
        self.constructing = False
        text = (f"error spawning actor mesh {msg.name!r}: rank {self.info.rank} on {rt.host}: "
                f"Cannot spawn new actors on mesh with supervision events ({why})")
        self.failed = SupervisionError(text, actor=msg.name, rank=self.info.rank, host=rt.host)
        self.spawn_refused = True
        actor_telemetry.status(self, "Failed", text)
        self.agent.send_reply(msg.reply, RuntimeError(text), ok=False, rank=self.info.rank)

    async def _run_async(self) -> None:
        import asyncio  # here, not at the top: a client that has no async actor never pays for it

        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        supervising = asyncio.Lock()  # one __supervise__ at a time, in the order the events came

        async def drain_events() -> None:
            async with supervising:
                while self.events and not self.stopping:
                    await self._supervise_async(self.events.popleft())

        def on_event() -> None:
            # As in Monarch, __supervise__ runs on the loop at once, also while an endpoint awaits
            # (one that waits for its child's failure to be supervised would wait forever otherwise).
            t = loop.create_task(drain_events())
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

        def direct(item: Any) -> None:
            # What is posted from now on goes straight to the loop (there used to be a pump thread
            # between: one more thread hand-over per call).
            try:
                if item is _WAKE:
                    loop.call_soon_threadsafe(on_event)
                else:
                    loop.call_soon_threadsafe(q.put_nowait, item)
            except RuntimeError:  # the loop closed: the actor was stopped
                pass

        # This thread waits for what the IO loop brings (through ``direct``): while it serves, the
        # proc's loop is not lent out (see ``Mailbox.run_until``).
        rt_mailbox = self.agent.rt.mailbox
        rt_mailbox.sleep_begin(self._async_waiter)
        with self._post_lock:  # what was posted before the loop ran first, in its order
            while not self.mailbox.empty():
                item = self.mailbox.get_nowait()
                if item is _WAKE:
                    loop.call_soon(on_event)
                else:
                    q.put_nowait(item)
            self._direct = direct
        try:
            while True:
                item = await q.get()
                if self.events:  # events jump the queue: before the messages already waiting
                    await drain_events()
                if item is _STOP:
                    break
                if isinstance(item, m.Call) and self._is_concurrent(item.method) and self.failed is None:
                    t = asyncio.ensure_future(self._handle_async(item, concurrent=True))
                    self.tasks.add(t)
                    t.add_done_callback(self.tasks.discard)
                    continue
                if await self._handle_async(item):
                    break
        finally:
            with self._post_lock:
                self._direct = None
            rt_mailbox.sleep_end(self._async_waiter)
            await self._cancel_tasks()

    async def _cancel_tasks(self) -> None:
        import asyncio  # here, not at the top: a client that has no async actor never pays for it

        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _is_concurrent(self, method: str) -> bool:
        desc = endpoint_spec(type(self.instance), method)
        return bool(desc is not None and desc.concurrent)

    # -- messages --------------------------------------------------------------

    def _prepare(self, call: m.Call) -> tuple[Any, tuple, dict, Any]:
        desc = endpoint_spec(type(self.instance), call.method)
        if desc is None:
            desc = _plain_method(type(self.instance), call.method)  # ``as_endpoint(mesh.method)``
        args, kwargs = call.payload.load()
        fn = desc.fn.__get__(self.instance)
        if desc.explicit_response_port:
            port = Port(call.reply, call.rank) if call.reply is not None else _NullPort(self, call.method)
            args = (port, *args)
        return fn, args, kwargs, desc

    def _handle_sync(self, item: Any) -> bool:
        """Handle one mailbox item; True when the actor should stop."""
        if isinstance(item, _Undelivered):
            self._undelivered(item)
            return False
        if isinstance(item, m.Call):
            if self._refuse(item):
                return False
            token = CURRENT.set(MessageContext(self.info, item.point, item.extent, item.rank))
            desc = None
            t, ok = actor_telemetry.begin(), False
            try:
                fn, args, kwargs, desc = self._prepare(item)
                if _is_async(desc):
                    # Only as_endpoint reaches one: this actor's own endpoints are all def.
                    raise TypeError(f"{self.msg.name}.{item.method} is an async def method, but its actor's "
                                    "endpoints are all def, so it has no event loop to run on")
                result = fn(*args, **kwargs)
                if debug_exit is not None:
                    debug_exit(None)
            except Exception as e:
                if debug_exit is not None:
                    debug_exit(e)
                self._failed_call(item, e, desc)
            except BaseException as e:
                self._died_in_call(item, e)
            else:
                ok = True
                self._answer(item, result, desc)
            finally:
                CURRENT.reset(token)
                actor_telemetry.handled(self, item, t, ok)
            return False
        if isinstance(item, m.StopActor):
            actor_telemetry.status(self, "Stopping")
            self._stop_children()
            self._cleanup_sync(None)
            actor_telemetry.status(self, "Stopped", self.stop_reason)
            self.agent.send_reply(item.reply, True, rank=item.rank)
            return True
        return False

    async def _handle_async(self, item: Any, concurrent: bool = False) -> bool:
        import asyncio  # here, not at the top: a client that has no async actor never pays for it

        if isinstance(item, _Undelivered):
            self._undelivered(item)
            return False
        if isinstance(item, m.Call):
            if self._refuse(item):
                return False
            token = CURRENT.set(MessageContext(self.info, item.point, item.extent, item.rank))
            desc = None
            t, ok = actor_telemetry.begin(), False
            try:
                fn, args, kwargs, desc = self._prepare(item)
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
                if debug_exit is not None:
                    debug_exit(None)
                ok = True
            except Exception as e:
                if debug_exit is not None:
                    debug_exit(e)
                self._failed_call(item, e, desc)
            except asyncio.CancelledError:
                if not self.stopping:
                    self._died_in_call(item, asyncio.CancelledError())
                    return False
                # A concurrent call cut short by a stop: its caller must not wait forever.
                if item.reply is not None:
                    err = SupervisionError(f"actor {self.display_name} was stopped during {item.method}",
                                           actor=self.msg.name, rank=item.rank, host=self.agent.rt.host)
                    self.agent.send_reply(item.reply, err, ok=False, rank=item.rank)
                raise
            except BaseException as e:
                if concurrent and item.reply is not None and not (desc and desc.explicit_response_port):
                    # Monarch sends it back from a concurrent endpoint, as an ActorError.
                    self.agent.send_reply(item.reply, self._actor_error(e, item.method, " with BaseException"),
                                          ok=False, rank=item.rank)
                else:
                    self._died_in_call(item, e)
            else:
                self._answer(item, result, desc)
            finally:
                CURRENT.reset(token)
                actor_telemetry.handled(self, item, t, ok)
            return False
        if isinstance(item, m.StopActor):
            # Monarch's order: the meshes it made, then its in-flight concurrent calls, then __cleanup__.
            actor_telemetry.status(self, "Stopping")
            self._stop_children()
            await self._cancel_tasks()
            cleanup = getattr(self.instance, "__cleanup__", None)
            if cleanup is not None:
                token = CURRENT.set(MessageContext(self.info, self.msg.point, self.msg.extent, self.info.rank))
                try:
                    r = cleanup(None)
                    if inspect.isawaitable(r):
                        await r
                except Exception:
                    log.exception("__cleanup__ failed")
                finally:
                    CURRENT.reset(token)
            actor_telemetry.status(self, "Stopped", self.stop_reason)
            self.agent.send_reply(item.reply, True, rank=item.rank)
            return True
        return False

    # -- supervision -------------------------------------------------------------

    def _supervise_sync(self, failure: MeshFailure) -> None:
        if self.failed is not None or self.instance is None:
            return
        token = CURRENT.set(MessageContext(self.info, self.msg.point, self.msg.extent, self.info.rank))
        try:
            sup = getattr(self.instance, "__supervise__", None)
            handled = sup(failure) if sup is not None else False
        except Exception as e:
            self._supervise_raised(failure, e)
            return
        finally:
            CURRENT.reset(token)
        self._after_supervise(handled, failure)

    async def _supervise_async(self, failure: MeshFailure) -> None:
        if self.failed is not None or self.instance is None:
            return
        token = CURRENT.set(MessageContext(self.info, self.msg.point, self.msg.extent, self.info.rank))
        try:
            sup = getattr(self.instance, "__supervise__", None)
            handled = sup(failure) if sup is not None else False
            if inspect.isawaitable(handled):
                handled = await handled
        except Exception as e:
            self._supervise_raised(failure, e)
            return
        finally:
            CURRENT.reset(token)
        self._after_supervise(handled, failure)

    def _supervise_raised(self, failure: MeshFailure, e: BaseException) -> None:
        self._fail(_failure_reason(f"__supervise__ raised while handling: {failure.report()}", e))

    def _after_supervise(self, handled: Any, failure: MeshFailure) -> None:
        if not handled:
            who = self.info.qualname if self.info and self.info.qualname else self.display_name
            headline = (f"The actor {who} failed because it did not handle a supervision event "
                        f"from its child. The event was:")
            self._fail(f"unhandled failure in a mesh it owns: {failure.report()}", headline=headline)

    # -- failing -------------------------------------------------------------------

    def _refuse(self, call: m.Call) -> bool:
        if self.failed is None:
            return False
        if call.reply is not None:
            self.agent.send_reply(call.reply, self._refusal(call.method), ok=False, rank=call.rank)
        return True

    def _refusal(self, method: str) -> Exception:
        f = self.failed
        assert f is not None
        if self.spawn_refused:
            return RuntimeError(f.message)  # as Monarch's: the spawn's own error, not a supervision event
        return SupervisionError(f.message, actor=f.actor, rank=f.rank, host=f.host, endpoint=f"{self.msg.name}.{method}()")

    def _answer(self, call: m.Call, result: Any, desc: Any) -> None:
        if call.reply is None:
            return
        if self.failed is not None:  # it aborted during the call
            self.agent.send_reply(call.reply, self._refusal(call.method), ok=False, rank=call.rank)
            return
        if desc.explicit_response_port:
            return
        try:
            payload = m.Pickled.of(result)
        except Exception as e:
            self._failed_call(call, TypeError(f"the result of {call.method} could not be pickled: {e}"), None)
            return
        self.agent.send_reply(call.reply, payload, rank=call.rank)

    def _failed_call(self, call: m.Call, e: Exception, desc: Any) -> None:
        explicit = desc is not None and desc.explicit_response_port
        if call.reply is not None and not explicit:
            self.agent.send_reply(call.reply, self._actor_error(e, call.method), ok=False, rank=call.rank)
            return
        # Nobody is waiting for this answer (a broadcast, or an endpoint that answers through its
        # own port): as in Monarch, the failure becomes the actor's.
        why = "raised with no caller to tell" if call.reply is None else "answers through its port and raised"
        self._fail(_failure_reason(f"Actor call {self.msg.name}.{call.method} failed.", e, f"endpoint {call.method} {why}"))
        if call.reply is not None:
            self.agent.send_reply(call.reply, self._refusal(call.method), ok=False, rank=call.rank)

    def _died_in_call(self, call: m.Call, e: BaseException) -> None:
        """A BaseException (SystemExit, KeyboardInterrupt, ...) in an endpoint kills the actor, as in Monarch."""
        self._fail(_failure_reason(f"Actor call {self.msg.name}.{call.method} failed with BaseException.", e))
        if call.reply is not None:
            self.agent.send_reply(call.reply, self._refusal(call.method), ok=False, rank=call.rank)

    def _actor_error(self, e: BaseException, method: str, how: str = "") -> m.Pickled:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        name = self.msg.name
        rank = self.info.rank if self.info else None
        host = self.agent.rt.host
        text = f"Actor call {name}.{method} failed{how}."
        err = ActorError(e, text, remote_traceback=tb, actor=f"{name}.{method}", rank=rank, host=host)
        try:
            return m.Pickled.of(err)
        except Exception:
            return m.Pickled.of(ActorError(None, f"{text} {type(e).__name__}: {e}", remote_traceback=tb,
                                           actor=f"{name}.{method}", rank=rank, host=host))

    def abort(self, reason: str | None = None) -> None:
        """``Instance.abort``: fail this actor; its owner gets a supervision event."""
        self._fail(f"aborted: {reason or 'no reason provided'}")

    def _fail(self, reason: str, headline: str | None = None) -> None:
        if self.failed is not None:
            return
        info = self.info
        rank = info.rank if info else None
        host = self.agent.rt.host
        detail = f"rank {rank if rank is not None else '?'} on {host}: {reason}"
        if headline is None:
            text = actor_failed_text(self.info.qualname if self.info and self.info.qualname else self.display_name, detail)
        else:
            text = headline + "\n" + "\n".join("  " + line for line in detail.splitlines())
        self.failed = SupervisionError(text, actor=self.msg.name, rank=rank, host=host)
        if not self.stopping:
            # As Monarch's actors do: a failed actor stops (Stopping), then is Failed.
            actor_telemetry.status(self, "Stopping")
        actor_telemetry.status(self, "Failed", text)
        if self.stopping:
            return  # what fails while it is being stopped is not news to its owner
        self.agent.poison(f"actor {self.display_name} failed on this proc")
        try:
            self.agent.rt.send(self.msg.owner, m.ActorFailed(self.agent.rt.addr, self.msg.actor_id, rank or 0, host, text))
        except Exception as e:
            # The owner is gone: there is nobody to tell; the failure stays in telemetry (status above).
            log.debug("%s: failure not sent to its owner: %s", self.display_name, e)

    # -- stopping -------------------------------------------------------------------

    def stop_self(self, reason: str | None = None) -> None:
        """``Instance.stop(reason)``: this actor stops once the messages already queued are handled
        (it runs ``__cleanup__(None)`` and stops the meshes it made); later calls raise
        SupervisionError.  A normal stop, not a failure: its owner is not told of a fault."""
        self.stop_reason = reason or "stopped by itself"
        self.agent.on_stop_actor(m.StopActor(self.msg.actor_id, m.PortRef("", 0), self.info.rank if self.info else 0))

    def stop(self, deadline: float) -> bool:
        """Stop this actor (``__cleanup__``, then the meshes it made, after the messages already
        queued) and join its threads by ``deadline`` (``time.monotonic()``); True if they ended."""
        self.begin_stop()
        self.post(m.StopActor(self.msg.actor_id, m.PortRef("", 0), self.info.rank if self.info else 0))
        return self.join(deadline)

    def join(self, deadline: float) -> bool:
        """Wait by ``deadline`` for this actor's thread to end; True if it did.  One in ``__init__``
        reads no mailbox yet: not waited for (its thread is a daemon)."""
        t = self.thread
        if t is not threading.current_thread() and t.is_alive() and not self.constructing:
            t.join(max(0.0, deadline - time.monotonic()))
        return not t.is_alive()

    def begin_stop(self) -> None:
        """A stop is on its way: supervision events from now on are dropped, as in Monarch."""
        self.stopping = True
        self.events.clear()

    def _cleanup_sync(self, exc: Exception | None) -> None:
        cleanup = getattr(self.instance, "__cleanup__", None)
        if cleanup is None:
            return
        token = CURRENT.set(MessageContext(self.info, self.msg.point, self.msg.extent, self.info.rank if self.info else 0))
        try:
            cleanup(exc)
        except Exception:
            log.exception("__cleanup__ failed")
        finally:
            CURRENT.reset(token)

    def _stop_children(self) -> None:
        # Last made, first stopped: actors before the procs they run on.
        children, self.children = self.children, []
        futures = []
        wait_s = child_stop_s()
        for child in reversed(children):
            try:
                futures.append(child.stop())
            except Exception as e:
                log.debug("could not stop %r: %s", child, e)
        for f in futures:
            try:
                f.get(timeout=wait_s)
            except Exception as e:
                log.debug("stopping a child mesh: %s", e)

    def post_undelivered(self, envelope: Any) -> None:
        """A message this actor sent came back (Monarch's undeliverable message)."""
        self.post(_Undelivered(envelope))

    def _undelivered(self, item: "_Undelivered") -> None:
        """Its ``_handle_undeliverable_message`` says whether it is handled; if not, the actor fails."""
        if self.instance is None or self.failed is not None:
            return
        token = CURRENT.set(MessageContext(self.info, self.msg.point, self.msg.extent, self.info.rank))
        try:
            handled = self.instance._handle_undeliverable_message(item.envelope)
        except Exception as e:
            handled, why = False, f"; _handle_undeliverable_message raised {type(e).__name__}: {e}"
        else:
            why = ""
        finally:
            CURRENT.reset(token)
        if not handled:
            self._fail(f"undeliverable message to {item.envelope.dest()}: {item.envelope.error_msg()}{why}")

    def post(self, item: Any) -> None:
        if isinstance(item, MeshFailure):
            if self.stopping:
                return
            self.events.append(item)
            item = _WAKE
        if self._direct is not None:  # an async actor whose loop runs
            with self._post_lock:
                direct = self._direct
                if direct is not None:
                    direct(item)
                    return
        self.mailbox.put(item)
        if self._direct is not None:
            # Its loop started between the look above and the put: it may have drained the queue
            # before the put (nobody reads the queue after that), so hand what is there on now.
            self._drain_to_direct()
            return
        if self._sleeping is not None:
            self._sleeping.sleep_end(self)
        elif self._polling is not None:
            self._polling.wake_borrower()  # posted off the loop: the thread that polls must look


    def _drain_to_direct(self) -> None:
        with self._post_lock:
            direct = self._direct
            if direct is None:
                return  # its loop ended meanwhile: the queue is read again (a stopping actor)
            while True:
                try:
                    item = self.mailbox.get_nowait()
                except queue.Empty:
                    return
                direct(item)


class _Waiter:
    """Stands for a thread among the sleepers of a mailbox (``Mailbox.sleep_begin``)."""

    __slots__ = ("_sleeping",)

    def __init__(self) -> None:
        self._sleeping: Any = None


@dataclass
class _Undelivered:
    """A mailbox item: a message the actor sent came back (``monarch.actor._mailbox``)."""

    envelope: Any


#: Set by monarch once an actor of this process stopped in the program's own debugger actor (Monarch's
#: ``DebugController``, ``monarch._src.actor.debugger.breakpoint``): called as each endpoint ends, with
#: what it raised (None: it returned), to end that message's debug session, after a post-mortem if it
#: raised.  None until then, so an endpoint pays one global read.
debug_exit: Callable[[BaseException | None], None] | None = None


def _is_async(desc: Any) -> bool:
    """Whether an endpoint's function is ``async def`` (asked once per endpoint: inspect's answer costs ~1 us)."""
    a = desc.__dict__.get("_is_async")
    if a is None:
        a = desc.__dict__["_is_async"] = inspect.iscoroutinefunction(desc.fn)
    return a


def _plain_method(cls: type, method: str) -> PlainMethod:
    # ``as_endpoint(..., explicit_response_port=True)`` sends "port:<name>".
    explicit, _, name = method.rpartition(":")
    fn = inspect.getattr_static(cls, name, None)
    if name.startswith("__") or not inspect.isfunction(fn) or explicit not in ("", "port"):
        raise AttributeError(f"{cls.__name__}.{name} is not an endpoint")
    return PlainMethod(fn, explicit == "port")


def _failure_reason(headline: str, e: BaseException, why: str = "") -> str:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
    return headline + (f" ({why})" if why else "") + "\n" + tb


def _qualname(creator: str, class_name: str, name: str, point: dict, extent: dict) -> str:
    """Monarch's name for an actor instance in log lines: ``<root>.<mod.Cls name{'gpus': 0/2}>``."""
    rank = "{" + ", ".join(f"'{k}': {point.get(k, 0)}/{v}" for k, v in extent.items()) + "}" if extent else ""
    return f"{creator or '<root>'}.<{class_name} {name}{rank}>"


class _NullPort:
    """The port of a call nobody answers (a ``broadcast``): values go nowhere, and an
    exception sent to it fails the actor, as Monarch's DroppingPort does."""

    def __init__(self, slot: ActorSlot, method: str):
        self._slot = slot
        self._method = method

    def send(self, value: Any) -> None:
        pass

    def exception(self, exc: BaseException) -> None:
        slot = self._slot
        slot._fail(_failure_reason(f"Actor call {slot.msg.name}.{self._method} failed.", exc,
                                   f"endpoint {self._method} sent an exception to a port nobody reads"))


def _linear(point: dict, extent: dict) -> int:
    r = 0
    for k, size in extent.items():
        r = r * size + point.get(k, 0)
    return r


class ProcAgent:
    """The actors of one process: a proc agent's, or the client's own (``this_proc()`` there)."""

    def __init__(self, rt: Runtime, config: dict, in_client: bool = False):
        self.rt = rt
        self.config = config
        self.in_client = in_client
        self.actors: dict[str, ActorSlot] = {}
        self.lazy: dict[str, Callable[[m.PortRef], m.SpawnActor]] = {}
        self.gone: collections.OrderedDict[str, None] = collections.OrderedDict()  # stopped actors, newest last
        self.early: dict[str, list[m.Call]] = {}  # calls that came before their actor's spawn (_EARLY_WAIT_S)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        #: Why this proc takes no new actors, once one of its actors failed (Monarch's "poisoned"
        #: proc: "Cannot spawn new actors on mesh with supervision events"); None while healthy.
        #: The actors already here go on answering.
        self.poisoned: str | None = None

    def poison(self, why: str) -> None:
        """An actor here failed: from now on spawns on this proc fail (the first reason is kept)."""
        with self.lock:
            if self.poisoned is None:
                self.poisoned = why

    def lazy_actor(self, actor_id: str, make: Callable[[m.PortRef], m.SpawnActor]) -> None:
        """Start the actor ``make(reply)`` describes when its first message comes (once)."""
        with self.lock:
            if actor_id not in self.actors:
                self.lazy.setdefault(actor_id, make)

    def register(self) -> "ProcAgent":
        rt = self.rt
        rt.register(m.SpawnActor, self.on_spawn)
        rt.register(m.Call, self.on_call)
        rt.register(m.StopActor, self.on_stop_actor)
        rt.register(m.StopProc, self.on_stop_proc)
        rt.register(m.ConfigDump, self.on_config_dump)
        actor_logging.install()
        return self

    def on_spawn(self, msg: m.SpawnActor) -> None:
        slot = ActorSlot(self, msg)
        with self.lock:
            self.actors[msg.actor_id] = slot
            held = self.early.pop(msg.actor_id, None) if self.early else None
        for call in held or ():
            slot.post(call)  # queued behind its __init__, in the order they came
        slot.thread.start()

    def forget(self, actor_id: str) -> None:
        with self.lock:
            self.actors.pop(actor_id, None)

    def on_call(self, msg: m.Call) -> None:
        actor_telemetry.arrived(msg)
        slot = self.actors.get(msg.actor_id)
        if slot is None and msg.actor_id in self.lazy:
            with self.lock:
                make = self.lazy.pop(msg.actor_id, None)
            if make is not None:
                self.on_spawn(make(m.PortRef(self.rt.addr, 0)))  # port 0: nobody waits for it
            slot = self.actors.get(msg.actor_id)
        if slot is None:
            if msg.actor_id not in self.gone and self._hold_early(msg):
                return
            if msg.reply is not None:
                self.send_reply(msg.reply, self._no_actor(msg), ok=False, rank=msg.rank)
            return
        slot.post(msg)

    def _hold_early(self, msg: m.Call) -> bool:
        """Keep a call for an actor not spawned here yet until its spawn comes (False: refuse it now)."""
        with self.lock:
            slot = self.actors.get(msg.actor_id)
            if slot is None:
                waiting = self.early.get(msg.actor_id)
                first = waiting is None
                if first:
                    if len(self.early) >= _EARLY_KEPT:
                        return False
                    waiting = self.early[msg.actor_id] = []
                waiting.append(msg)
        if slot is not None:  # spawned meanwhile
            slot.post(msg)
        elif first:
            self.rt.mailbox.call_later(_EARLY_WAIT_S, lambda: self._early_expired(msg.actor_id))
        return True

    def _early_expired(self, actor_id: str) -> None:
        with self.lock:
            held = self.early.pop(actor_id, [])
        for msg in held:
            if msg.reply is not None:
                self.send_reply(msg.reply, self._no_actor(msg), ok=False, rank=msg.rank)

    def _no_actor(self, msg: m.Call) -> SupervisionError:
        name = msg.actor_id.rsplit("-", 1)[0]
        endpoint = f"{name}.{msg.method}()"
        if msg.actor_id in self.gone:
            return SupervisionError(f"Supervision event: actor {name}[{msg.rank}] has status: stopped "
                                    f"(its mesh was stopped; it no longer takes calls)", actor=name, rank=msg.rank,
                                    host=self.rt.host, endpoint=endpoint)
        return SupervisionError(f"no actor {msg.actor_id!r} on this proc (it was stopped or never started)",
                                actor=name, rank=msg.rank, host=self.rt.host, endpoint=endpoint)

    def on_stop_actor(self, msg: m.StopActor) -> None:
        with self.lock:
            slot = self.actors.pop(msg.actor_id, None)
            self.gone[msg.actor_id] = None
            if len(self.gone) > _GONE_KEPT:
                self.gone.popitem(last=False)
        if slot is None:
            self.send_reply(msg.reply, True, rank=msg.rank)
            return
        if msg.reason and slot.stop_reason is None:
            slot.stop_reason = msg.reason
        slot.begin_stop()
        if slot.constructing:
            # As in Monarch, an actor whose __init__ has not returned (it may never) is stopped at
            # once: no call reaches it from now on.  Should __init__ return, it stops then (its
            # __cleanup__ runs) with nobody waiting for that answer.
            self.send_reply(msg.reply, True, rank=msg.rank)
            msg = m.StopActor(msg.actor_id, m.PortRef("", 0), msg.rank)
        slot.post(msg)

    def is_owner(self, addr: str) -> bool:
        """Whether ``addr`` owns an actor here (it spawned its mesh): this proc waits for an owner
        that stopped reading rather than give up on it (``message_delivery_timeout``)."""
        with self.lock:
            return any(s.msg.owner == addr for s in self.actors.values())

    def on_config_dump(self, msg: m.ConfigDump) -> None:
        """The environment variables asked for (those settings come from) and what this process
        configured itself: the mesh admin API turns them into the proc's settings."""
        from monarch_agents import context

        env = {n: os.environ[n] for n in msg.names if isinstance(n, str) and n in os.environ}
        try:
            runtime = dict(context.config_source()) if context.config_source is not None else {}
        except Exception as e:  # a broken hook must not leave the asker waiting
            log.debug("config source failed: %s", e)
            runtime = {}
        self.send_reply(msg.reply, {"env": env, "runtime": runtime})

    def on_stop_proc(self, msg: m.StopProc) -> None:
        # Off the runtime's thread (the actors' __cleanup__ may call out and wait for answers); it
        # ends by itself, bounded by stop()'s deadline.
        threading.Thread(target=self._stop_all, args=(msg,), name="proc-stop", daemon=True).start()

    def stop(self, deadline: float) -> list[str]:
        """Stop every actor of this proc against one ``deadline`` (``time.monotonic()``): each runs
        ``__cleanup__`` and stops the meshes it made, and its threads are joined by then.  Returns
        the actors whose threads were still running at the deadline (hung in user code)."""
        with self.lock:
            slots, self.actors = list(self.actors.values()), {}
        for s in slots:  # every stop posted first: they run at once, not one after another
            s.begin_stop()
            s.post(m.StopActor(s.msg.actor_id, m.PortRef("", 0), s.info.rank if s.info else 0))
        late = [s.display_name for s in slots if not s.join(deadline)]
        if late:
            # A stop that fails or hangs in user code must not keep this proc from stopping.
            log.debug("actors still running at the stop's deadline: %s", ", ".join(late))
        return late

    def _stop_all(self, msg: m.StopProc) -> None:
        with self.lock:
            owners = {s.msg.owner for s in self.actors.values()}
        # Owners other than the one stopping us hear it is a stop, not a failure.
        owners -= {msg.reply.addr if msg.reply is not None else "", self.rt.addr}
        for owner in owners:
            try:
                self.rt.send(owner, m.ProcStopping(self.rt.addr))
            except Exception as e:
                log.debug("ProcStopping not sent to %s (already gone): %s", owner, e)
        self.stop(time.monotonic() + child_stop_s())
        if not self.in_client:
            finalize()
        if msg.reply is not None:
            self.send_reply(msg.reply, True)
        if not self.in_client:
            self.stopped.set()

    def send_reply(self, port: m.PortRef, value: Any, ok: bool = True, rank: int = 0) -> None:
        if port is None or not port.addr:
            return  # nobody waits (an actor that stopped itself)
        try:
            self.rt.send(port.addr, m.Reply(port.port_id, rank, ok, value))
        except OversizedMessage as e:
            # Too long to send (codec_max_frame_length): the caller hears that instead of waiting.
            try:
                self.rt.send(port.addr, m.Reply(port.port_id, rank, False, OversizedMessage(f"the answer was not sent: {e.message}")))
            except Exception as e2:
                log.debug("could not answer %s: %s", port, e2)
        except Exception as e:
            log.debug("could not answer %s: %s", port, e)

    def supervise(self, slot_info: ActorSlotInfo, failure: MeshFailure) -> None:
        slot = slot_info.slot
        if isinstance(slot, ActorSlot):
            slot.post(failure)


def finalize() -> None:
    """What interpreter exit would do, for a proc that ends with ``os._exit``: ``atexit``
    handlers, then the objects user modules hold (their ``__del__`` runs)."""
    try:
        atexit._run_exitfuncs()
    except Exception:
        log.exception("an atexit handler failed")
    system = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}
                   if p)
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        spec = getattr(mod, "__spec__", None)
        top = (getattr(spec, "name", None) or name).split(".")[0]  # __main__ is the zygote here
        if not path or os.path.realpath(path).startswith(system) or _kept(top):
            continue
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        # Newest names first: what a module made last tends to use what it made before.
        for key in reversed(list(d)):
            if not (key.startswith("__") and key.endswith("__")):
                try:
                    del d[key]
                except KeyError:
                    pass  # a module's code, run by a finalizer just now, removed it first
    gc.collect()


def _kept(top: str) -> bool:
    """Packages whose objects ``finalize`` leaves alone: the workbench's own (``monarch`` and every
    ``monarch_*``, matched by prefix so this layer names none above it) and pytest's."""
    return top == "monarch" or top.startswith("monarch_") or top in ("pytest", "_pytest")

_agent: ProcAgent | None = None


def current_agent() -> ProcAgent | None:
    # A client's agent belongs to its runtime: once that is closed (a test session starts a new
    # client), the old agent would leave the new runtime without handlers.
    if _agent is not None and _agent.rt.closed:
        return None
    return _agent


def host_actors_in_client(rt: Runtime) -> ProcAgent:
    """Let this client process run actors itself (``this_proc().spawn`` in the client), once per process.

    The actors live on the client's first runtime; a client of several jobs answers spawns and
    calls on each job's runtime too (see :func:`share_client_agent`)."""
    global _agent
    from monarch_agents import runtime as rt_mod

    with _agent_lock:
        if _agent is None or _agent.rt.closed:
            base = rt_mod.current() or rt
            _agent = ProcAgent(base, {}, in_client=True).register()
            _agent_runtimes.clear()
            _agent_runtimes.add(id(base))
        for other in {id(r): r for r in (rt, *rt_mod.client_runtimes())}.values():
            _share(_agent, other)
        return _agent


def share_client_agent(rt: Runtime) -> None:
    """``rt`` (another job's runtime in this client) hands spawns and calls to the client's actors too."""
    with _agent_lock:
        if _agent is not None and not _agent.rt.closed:
            _share(_agent, rt)


def _share(agent: ProcAgent, rt: Runtime) -> None:
    if id(rt) in _agent_runtimes or rt.closed:
        return
    _agent_runtimes.add(id(rt))
    rt.register(m.SpawnActor, agent.on_spawn)
    rt.register(m.Call, agent.on_call)
    rt.register(m.StopActor, agent.on_stop_actor)
    rt.register(m.StopProc, agent.on_stop_proc)


#: The runtimes (by id) the client's agent answers on.
_agent_runtimes: set[int] = set()
_agent_lock = threading.Lock()


def _exit_on_sigterm(rt_box: list) -> None:
    """SIGTERM (the owner is gone, or a stop ran out of time): hand the telemetry rows recorded
    since the last push to the host agent, then exit at once; never more than half a second."""
    threading.Timer(_SIGTERM_FLUSH_S, lambda: os._exit(143)).start()
    try:
        actor_telemetry.stop()
        if rt_box:
            rt_box[0].close()  # lingers until what was queued has left (bounded)
    finally:
        os._exit(143)


#: How long a proc told to terminate may spend pushing its last telemetry rows.
_SIGTERM_FLUSH_S = 0.5


def main(config: dict) -> None:
    """Entry point in a freshly forked proc (called by the zygote)."""
    global _agent
    logging.basicConfig(level=os.environ.get("MONARCH_LOG", "WARNING"))
    rt_box: list[Runtime] = []
    signal.signal(signal.SIGTERM, lambda *_: _exit_on_sigterm(rt_box))
    keys = JobKeys(**config["keys"])
    # The zygote's sys.path was fixed when it started; put the spawner's own entries (its
    # script's directory, say) first, in its order, so its modules import here by name too.
    extra = [p for p in os.environ.get("MONARCH_SYS_PATH", "").split(os.pathsep) if p]
    sys.path[:0] = [p for p in extra if p not in sys.path]
    # Variables the spawner removed from its environment since the host agent started are gone
    # already: the zygote removed them (ENV_UNSET) before anything read the environment.
    os.environ["MONARCH_HOST_AGENT"] = config["host_agent"]
    os.environ["MONARCH_HOST_RANK"] = str(config["host_rank"])
    from monarch_agents import debug_rank

    debug_rank.install()  # breakpoint() in an endpoint pauses that actor for `monarch debug`
    rt = install(Runtime(keys, bind_host=config["bind_host"], name=f"proc[{config['mesh_id']}]", host=config["host"]))
    rt_box.append(rt)
    agent = _agent = ProcAgent(rt, config).register()
    rt.mailbox.patient = agent.is_owner
    supervision.install(rt)
    supervision.ends_process = False  # the client ends at an unhandled failure, not its procs
    rt.start()
    if os.environ.get("MONARCH_LEND_LOOP", "1") != "0":
        # Threads that wait for what the loop brings (actors' threads, their Future.get) may run
        # it themselves (monarch_agents.transport.Mailbox.run_until); MONARCH_LEND_LOOP=0: never.
        future.process_loop = rt.mailbox
    actor_telemetry.start(rt, config)
    rt.send(config["host_agent"], m.ProcReady(config["token"], rt.addr, os.getpid()))
    agent.stopped.wait()
    actor_telemetry.stop()
    rt.close()

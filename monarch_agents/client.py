"""The runtime of a client process: the one that talks to a job's host agents.

Used through the monarch layer: ``monarch.actor`` (a controller program) and
``monarch.job`` (runs, shells, status, logs), which pass the reservation's keys;
kept outside ``monarch.actor`` so those commands do not import the actor API.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterable

from monarch_agents import runtime as rt_mod
from monarch_agents import messages as m
from monarch_agents import supervision
from monarch_agents.errors import MonarchError
from monarch_agents import keys as keys_mod
from monarch_agents.keys import CLIENT, HOST, JobKeys
from monarch_agents.runtime import Runtime
from monarch_agents.transport import addr_host, is_relayed, is_same_host, lacks_client_key, route_ip

_lock = threading.RLock()
#: The control stream that keeps a runtime's relayed address open, by runtime (see :func:`_relayed_address`).
_relay_controls: dict[int, Any] = {}
#: The ``route`` each runtime was started with, by runtime (for helper processes that must go the same way).
_routes: dict[int, dict | None] = {}
#: This process's runtimes, one per job (keys) it talks to.
_by_keys: dict[JobKeys, Runtime] = {}


def current_route(rt: Runtime | None = None) -> dict | None:
    """How ``rt`` (default: this process's first runtime) reaches its hosts when not directly
    (see :func:`ensure_runtime`)."""
    rt = rt or rt_mod.current()
    return _routes.get(id(rt)) if rt is not None else None


def bind_address(reach: Iterable[str] = ()) -> str:
    """Where a client listens: ``MONARCH_BIND``, else the address this machine uses to reach the
    first of ``reach`` (its hosts must be able to answer it there), else loopback."""
    bind = os.environ.get("MONARCH_BIND")
    if bind:
        return bind
    for addr in reach:
        return route_ip(addr_host(addr))
    return "127.0.0.1"


def _unix_only(reach: list[str]) -> bool:
    """Whether a runtime may listen on its Unix socket only: a `monarch` command (it hears only its
    host agents, monarch_agents.keys) whose host agents are all processes of this host, which reach
    it there.  No TCP port then: no ZeroMQ context, no CURVE gate, not even pyzmq imported."""
    return bool(reach) and keys_mod.agents_only() and all(
        is_same_host(a) and not is_relayed(a) and not lacks_client_key(a) for a in reach)


def _from_agents(msg_type: type, role: str) -> bool:
    # HOST: host agents in pods, which hold their own pair instead of the client's secret.
    return role in (CLIENT, HOST)


def ensure_runtime(keys: JobKeys | None = None, reach: Iterable[str] = (), route: dict | None = None) -> Runtime:
    """This process's runtime for the job of ``keys``, started on first use.

    One runtime per job, several in one process: a program may hold meshes of two
    reservations (or a reservation and ``this_host()``).  The first one started is the
    process's current runtime (what ``keys=None`` returns, and what ports and actors hosted in
    the client use); a message to a peer of another job goes through that job's runtime
    (``monarch_agents.runtime.claim``).

    ``reach``: agent addresses it will talk to, so it listens where their answers can arrive.
    ``route``: how a reservation's hosts are reached when not directly (a reservation's
    ``route``: ``{"via": "port-forward", "socks": "HOST:PORT", "control": PATH}``).
    """
    with _lock:
        reach = list(reach)
        current = rt_mod.current()
        if current is not None and (keys is None or keys == current.keys):
            return current
        rt = _by_keys.get(keys) if keys is not None else None
        if rt is not None and not rt.closed:
            return rt
        keys = keys or JobKeys.generate()
        # A second runtime needs a ZeroMQ context of its own: each context has one ZAP handler,
        # which admits one job's keys.
        unix_only = not route and _unix_only(reach)
        ctx = None
        if current is not None and not unix_only:
            from monarch_agents import transport

            ctx = transport.new_context()
        name = "client" if current is None else f"client-{len(_by_keys) + 1}"
        # A `monarch` command's process hosts no actor: it hears only its host agents (monarch_agents.keys).
        admit = _from_agents if keys_mod.agents_only() else None
        if route and route.get("via") == "port-forward":
            holder: list[Runtime] = []
            rt = Runtime(keys, bind_host="127.0.0.1", name=name, socks_proxy=route["socks"], ctx=ctx, admit=admit,
                         advertise=lambda endpoint: _relayed_address(holder, route["control"], endpoint))
            holder.append(rt)
        else:
            rt = Runtime(keys, bind_host=bind_address(reach), name=name, ctx=ctx, admit=admit, tcp=not unix_only)
        _routes[id(rt)] = route
        supervision.install(rt)
        rt.register(m.ActorDebugWaiting, _debug_waiting)
        rt.start()
        _by_keys[keys] = rt
        if current is None:
            rt_mod.install(rt)
        else:
            rt_mod.add_client_runtime(rt)
            rt_mod.claim(rt, reach)
            from monarch_agents.proc_agent import share_client_agent

            share_client_agent(rt)
        return rt


def _relayed_address(holder: list, control: str, endpoint: str) -> str:
    """Ask the reservation's forwarder for an address in the cluster that reaches ``endpoint``.

    The answer stays valid while this process keeps the control stream open (until it exits or
    closes its runtime).
    """
    import json
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(control)
        s.sendall(json.dumps({"local": endpoint.split("://", 1)[-1]}).encode() + b"\n")
        answer = json.loads(s.makefile("rb").readline() or b"{}")
    except (OSError, ValueError) as e:
        s.close()
        raise MonarchError(f"the reservation's port-forward does not answer ({control}: {e})",
                           "`monarch status` starts it again if it died") from None
    if "advertise" not in answer:
        s.close()
        raise MonarchError(f"the reservation's port-forward refused: {answer.get('error', 'no answer')}",
                           "`monarch status` says whether the pods still run")
    s.settimeout(None)
    _relay_controls[id(holder[0])] = s
    return answer["advertise"]


def _debug_waiting(msg: m.ActorDebugWaiting) -> None:
    """An actor of this program stopped in breakpoint(): say so once, on stderr."""
    import sys

    from monarch_agents.services.debug import waiting_line

    sys.stderr.write(f"{waiting_line(msg.session)}\n")
    sys.stderr.flush()


def close_runtime() -> None:
    """Close this process's runtimes; the next :func:`ensure_runtime` starts a fresh one."""
    from monarch_agents import transport

    with _lock:
        for rt in [*rt_mod.client_runtimes(), *_by_keys.values()]:
            if not rt.closed:
                rt.close()
            rt_mod.uninstall(rt)
            control = _relay_controls.pop(id(rt), None)
            if control is not None:
                control.close()
        _by_keys.clear()
        _routes.clear()
        # The next runtime gets a fresh ZeroMQ context: the closed one's ZAP handler may still
        # hold its inproc address for a moment (sockets close asynchronously).
        transport.reset_context()

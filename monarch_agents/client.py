"""The runtime of a client process: the one that talks to a job's host agents.

Used through the monarch layer: ``monarch.actor`` (a controller program) and
``monarch.job`` (runs, shells, status, logs), which pass the reservation's keys;
kept outside ``monarch.actor`` so those commands do not import the actor API.
"""

from __future__ import annotations

import os
import threading
from typing import Iterable

from monarch_agents import runtime as rt_mod
from monarch_agents import messages as m
from monarch_agents import supervision
from monarch_agents.errors import MonarchError
from monarch_agents.keys import JobKeys
from monarch_agents.runtime import Runtime
from monarch_agents.transport import addr_host, route_ip

_lock = threading.RLock()
#: The control stream that keeps this process's relayed address open (see :func:`_relayed_address`).
_relay_control = None
#: The ``route`` this process's runtime was started with (for helper processes that must go the same way).
_route: dict | None = None


def current_route() -> dict | None:
    """How this process's runtime reaches its hosts when not directly (see :func:`ensure_runtime`)."""
    return _route


def bind_address(reach: Iterable[str] = ()) -> str:
    """Where a client listens: ``MONARCH_BIND``, else the address this machine uses to reach the
    first of ``reach`` (its hosts must be able to answer it there), else loopback."""
    bind = os.environ.get("MONARCH_BIND")
    if bind:
        return bind
    for addr in reach:
        return route_ip(addr_host(addr))
    return "127.0.0.1"


def ensure_runtime(keys: JobKeys | None = None, reach: Iterable[str] = (), route: dict | None = None) -> Runtime:
    """This process's runtime, started on first use (with ``keys`` when it talks to a reservation).

    ``reach``: agent addresses it will talk to, so it listens where their answers can arrive.
    ``route``: how a reservation's hosts are reached when not directly (a reservation's
    ``route``: ``{"via": "port-forward", "socks": "HOST:PORT", "control": PATH}``).
    """
    with _lock:
        rt = rt_mod.current()
        if rt is not None:
            if keys is not None and keys != rt.keys:
                raise RuntimeError("this process already talks to another monarch job; "
                                   "use one reservation per process (or load the job before calling this_host())")
            return rt
        keys = keys or JobKeys.generate()
        global _route
        _route = route
        if route and route.get("via") == "port-forward":
            rt = Runtime(keys, bind_host="127.0.0.1", name="client", socks_proxy=route["socks"],
                         advertise=lambda endpoint: _relayed_address(route["control"], endpoint))
        else:
            rt = Runtime(keys, bind_host=bind_address(reach), name="client")
        supervision.install(rt)
        rt.register(m.ActorDebugWaiting, _debug_waiting)
        rt.start()
        rt_mod.install(rt)
        return rt


def _relayed_address(control: str, endpoint: str) -> str:
    """Ask the reservation's forwarder for an address in the cluster that reaches ``endpoint``.

    The answer stays valid while this process keeps the control stream open (until it exits or
    closes its runtime).
    """
    import json
    import socket

    global _relay_control
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
    _relay_control = s
    return answer["advertise"]


def _debug_waiting(msg: m.ActorDebugWaiting) -> None:
    """An actor of this program stopped in breakpoint(): say so once, on stderr."""
    import sys

    from monarch_agents.services.debug import waiting_line

    sys.stderr.write(f"{waiting_line(msg.session)}\n")
    sys.stderr.flush()


def close_runtime() -> None:
    """Close this process's runtime; the next :func:`ensure_runtime` starts a fresh one."""
    from monarch_agents import transport

    with _lock:
        global _relay_control, _route
        _route = None
        rt = rt_mod.current()
        if rt is not None:
            rt.close()
        rt_mod.uninstall(rt)
        if _relay_control is not None:
            _relay_control.close()
            _relay_control = None
        # The next runtime gets a fresh ZeroMQ context: the closed one's ZAP handler may still
        # hold its inproc address for a moment (sockets close asynchronously).
        transport.reset_context()

"""Monarch's ``monarch.tools.network``: the address a host name resolves to, as its launcher and
programs pass one to workers (``get_sockaddr("node3", 26600)`` -> ``"[2001:db8::7]:26600"``).

IPv6 is preferred and IPv4 taken when the host has none; a link-local address (``fe80::/10``,
``169.254/16``) is skipped, as a peer cannot reach it without a scope.  Nothing found is a
``RuntimeError``.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import socket

__all__ = ["AddrType", "get_ipaddr", "get_sockaddr"]

log = logging.getLogger(__name__)


class AddrType(enum.Enum):
    """Which family ``get_ipaddr`` resolves: ``Default`` is IPv6, else IPv4."""

    Default = enum.auto()
    IPv4 = enum.auto()
    IPv6 = enum.auto()


_FAMILIES = {
    AddrType.Default: (socket.AF_INET6, socket.AF_INET),
    AddrType.IPv4: (socket.AF_INET,),
    AddrType.IPv6: (socket.AF_INET6,),
}


def _first_usable(hostname: str, port: int, family: socket.AddressFamily) -> str | None:
    """The first TCP address of ``family`` for ``hostname``, unless there is none or it is link-local."""
    try:
        found = socket.getaddrinfo(hostname, port, family, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        log.info("%s has no %s address for TCP: %s", hostname, family.name, e)
        return None
    if not found:
        return None
    addr = str(found[0][4][0])  # (host, port) or (host, port, flowinfo, scope_id)
    if ipaddress.ip_address(addr.split("%", 1)[0]).is_link_local:
        log.info("%s resolves to link-local %s: skipped, other processes cannot reach it", hostname, addr)
        return None
    return addr


def _unresolved(hostname: str) -> RuntimeError:
    return RuntimeError(f"cannot resolve {hostname!r} to an IPv6 or IPv4 address a TCP socket can use; "
                        "check the host's network configuration")


def get_ipaddr(hostname: str, port: int, addr_type: AddrType = AddrType.Default) -> str:
    """The IP address (no brackets, no port) ``hostname`` resolves to, of the family ``addr_type`` asks."""
    try:
        families = _FAMILIES[addr_type]
    except KeyError:
        raise ValueError(f"Unknown AddrType: {addr_type!r}") from None
    for family in families:
        addr = _first_usable(hostname, port, family)
        if addr:
            return addr
    raise _unresolved(hostname)


def get_sockaddr(hostname: str, port: int) -> str:
    """``ip:port`` for IPv4, ``[ip]:port`` for IPv6, IPv6 preferred."""
    for family in (socket.AF_INET6, socket.AF_INET):
        addr = _first_usable(hostname, port, family)
        if addr:
            return f"[{addr}]:{port}" if family == socket.AF_INET6 else f"{addr}:{port}"
    raise _unresolved(hostname)

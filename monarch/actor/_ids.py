"""Identities and transports as PyTorch Monarch names them: ``Uid``, ``ProcId``, ``ChannelTransport``.

Monarch's ``Uid`` is a 64-bit instance value with an optional label, written ``label<v>`` where
``v`` is the value in base 58 (digits, then lower case, then upper case, without ``0 O I l``), or a
bare name for a singleton.  Two instance uids are equal when their values are; labels are for
people.  Ours are the same values written the same way, so a uid printed by one parses in the other.

``enable_transport`` chooses what Monarch's procs talk over.  Ours always talk CURVE over TCP
between hosts and authenticated Unix sockets within a host (see ``monarch_agents.transport``), so
the choice is checked and remembered (``enabled_transport()``), and the rules Monarch enforces
(one transport per process, chosen before the first mesh) hold here too.
"""

from __future__ import annotations

import enum
import os
import threading
from typing import Any

_ALPHABET = "123456789abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"
_DIGIT = {c: i for i, c in enumerate(_ALPHABET)}
_MASK = (1 << 64) - 1


def _encode(value: int) -> str:
    out = ""
    while True:
        value, d = divmod(value, 58)
        out = _ALPHABET[d] + out
        if value == 0:
            return out


def _decode(text: str) -> int:
    value = 0
    for c in text:
        if c not in _DIGIT:
            raise ValueError(f"invalid uid value {text!r}: {c!r} is not a base-58 digit")
        value = value * 58 + _DIGIT[c]
    if value > _MASK:
        raise ValueError(f"invalid uid value {text!r}: more than 64 bits")
    return value


class Uid:
    """A unique identifier: an instance (a 64-bit value and an optional label) or a singleton (a name)."""

    __slots__ = ("_value", "_label")

    def __init__(self, value: int | None, label: str | None):
        self._value = value
        self._label = label

    @staticmethod
    def anonymous() -> "Uid":
        """A fresh instance uid without a label."""
        return Uid(int.from_bytes(os.urandom(8), "little"), None)

    @staticmethod
    def instance(label: str | None = None) -> "Uid":
        """A fresh instance uid, with ``label`` shown before its value."""
        return Uid(int.from_bytes(os.urandom(8), "little"), label)

    @staticmethod
    def instance_from_value(value: int, label: str | None = None) -> "Uid":
        """The instance uid of ``value`` (0 to 2**64-1)."""
        if not isinstance(value, int) or not 0 <= value <= _MASK:
            raise ValueError(f"a uid value is an integer from 0 to 2**64-1, got {value!r}")
        return Uid(value, label)

    @staticmethod
    def from_string(uid: str) -> "Uid":
        """Parse ``label<v>``, ``<v>`` or a singleton's bare name."""
        if uid.endswith(">") and "<" in uid:
            label, _, rest = uid[:-1].rpartition("<")
            return Uid(_decode(rest), label or None)
        if not uid or any(c in uid for c in "<>@ "):
            raise ValueError(f"invalid uid {uid!r}")
        return Uid(None, uid)

    @property
    def label(self) -> str | None:
        return self._label

    @property
    def is_instance(self) -> bool:
        return self._value is not None

    @property
    def is_singleton(self) -> bool:
        return self._value is None

    @property
    def instance_value(self) -> int | None:
        return self._value

    def __str__(self) -> str:
        if self._value is None:
            return self._label or ""
        return f"{self._label or ''}<{_encode(self._value)}>"

    def __repr__(self) -> str:
        return f"Uid({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Uid):
            return NotImplemented
        if self._value is None or other._value is None:
            return self._value is other._value and self._label == other._label
        return self._value == other._value

    def __hash__(self) -> int:
        return hash(self._value if self._value is not None else ("singleton", self._label))

    def __reduce__(self) -> Any:
        return Uid, (self._value, self._label)


class ProcId:
    """The identity of a proc: a :class:`Uid` (``service<v>`` for a host's service proc)."""

    __slots__ = ("_uid",)

    def __init__(self, uid: Uid):
        if not isinstance(uid, Uid):
            raise TypeError(f"ProcId takes a Uid, got {type(uid).__name__}")
        self._uid = uid

    @staticmethod
    def from_string(proc_id: str) -> "ProcId":
        return ProcId(Uid.from_string(proc_id))

    @property
    def uid(self) -> Uid:
        return self._uid

    @property
    def label(self) -> str | None:
        return self._uid.label

    def __str__(self) -> str:
        return str(self._uid)

    def __repr__(self) -> str:
        return f"ProcId({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcId) and self._uid == other._uid

    def __hash__(self) -> int:
        return hash(("proc", self._uid))

    def __reduce__(self) -> Any:
        return ProcId, (self._uid,)


class ChannelTransport(enum.Enum):
    """The transports Monarch names (``monarch.actor.enable_transport`` takes one)."""

    TcpWithLocalhost = "tcp-localhost"
    TcpWithHostname = "tcp"
    MetaTlsWithHostname = "metatls-hostname"
    MetaTlsWithIpV6 = "metatls"
    MetaQuicWithHostname = "metaquic-hostname"
    MetaQuicWithIpV6 = "metaquic"
    Quic = "quic"
    Tls = "tls"
    Local = "local"
    Unix = "ipc"

    def get(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"ChannelTransport.{self.name}"  # as Monarch's


_SHORTCUTS = {"tcp": ChannelTransport.TcpWithHostname, "ipc": ChannelTransport.Unix,
              "metatls": ChannelTransport.MetaTlsWithIpV6, "metatls-hostname": ChannelTransport.MetaTlsWithHostname,
              "tls": ChannelTransport.Tls}
_transport: "ChannelTransport | str | None" = None
_transport_lock = threading.Lock()


def enable_transport(transport: "ChannelTransport | str") -> None:
    """Choose the transport, as Monarch's ``enable_transport`` (before the first mesh; one per process).

    Accepted: a :class:`ChannelTransport`, a shortcut (``"tcp"``, ``"ipc"``, ``"metatls"``,
    ``"metatls-hostname"``, ``"tls"``) or an address (``"tcp://127.0.0.1:8080"``).  monarch's
    messages always go CURVE/TCP between hosts and over authenticated Unix sockets within one
    (a TLS choice is covered by CURVE's encryption); an address of the form ``tcp://HOST[:PORT]``
    sets where this client listens (``MONARCH_BIND``).
    """
    global _transport
    if isinstance(transport, str):
        chosen: ChannelTransport | str = _SHORTCUTS.get(transport, transport)
        if isinstance(chosen, str) and "://" not in chosen:
            raise ValueError(f"unknown transport {transport!r}: give a ChannelTransport, one of "
                             f"{sorted(_SHORTCUTS)}, or an address such as 'tcp://127.0.0.1:8080'")
    elif isinstance(transport, ChannelTransport):
        chosen = transport
    else:
        raise TypeError(f"enable_transport takes a ChannelTransport or a str, got {type(transport).__name__}")
    from monarch_agents import runtime

    with _transport_lock:
        if runtime.current() is not None and _transport != chosen:
            raise RuntimeError("`enable_transport()` must be called before any other calls in the monarch API "
                               "(this process already started its client)")
        if _transport is not None and _transport != chosen:
            raise RuntimeError(f"Only one transport type may be enabled at one time. Currently enabled transport "
                               f"type is `{_transport}`. Attempted to enable transport type `{chosen}`.")
        _transport = chosen
        if isinstance(chosen, str) and chosen.startswith("tcp://"):
            host = chosen[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
            if host and host != "*":
                os.environ["MONARCH_BIND"] = host


def enabled_transport() -> "ChannelTransport | str":
    """What :func:`enable_transport` chose (Monarch's default, Unix, when it was not called)."""
    return _transport if _transport is not None else ChannelTransport.Unix

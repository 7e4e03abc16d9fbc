"""Hosts with their own network stack on one machine: Linux network namespaces on a bridge.

``monarch serve --hosts 4 --netns`` (and the test Slurm cluster) put each host
in its own network namespace, with its own address on a private bridge, so
every message between hosts takes the path it takes between real machines:
TCP with CURVE, ZeroMQ's heartbeats, no shared Unix sockets.  This module is
the only place that creates or removes them::

    bridge  mnb<tag>   10.213.N.1/24     (this machine's side: the client binds here)
      |-- veth mnv<tag>-0 <-> eth0 in netns monarch-<tag>-h0   10.213.N.11
      |-- veth mnv<tag>-1 <-> eth0 in netns monarch-<tag>-h1   10.213.N.12
      ...

The subnet is the first ``10.213.N.0/24`` no route on this machine uses yet
(chosen under a lock, so concurrent serves get different ones).  Namespaces have
no default route: a host reaches the bridge's subnet and nothing else.

Prerequisites: root, and ``ip`` (iproute2) and ``nsenter`` (util-linux).

What this module does not do: give a host its own hostname, filesystem or
process table (``/dev/shm`` stays shared, which monarch never relies on between
hosts), or route a namespace to the outside world.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass

#: The /16 that subnets are taken from (a /24 per reservation).
SUPERNET = "10.213.0.0/16"
_LOCK = "/run/lock/monarch-netns.lock" if os.path.isdir("/run/lock") else "/tmp/monarch-netns.lock"
_FIRST_HOST = 11


class NetnsError(Exception):
    """Namespaces cannot be made here; ``hint`` says what would fix it."""

    def __init__(self, message: str, hint: str = ""):
        self.message, self.hint = message, hint
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class NetnsHost:
    """One host: its namespace, its address, and the root-side end of its link."""

    netns: str
    ip: str
    link: str  # the veth end on the bridge: down = the host's network is cut

    @property
    def path(self) -> str:
        return f"/run/netns/{self.netns}"


@dataclass(frozen=True, slots=True)
class NetnsPlan:
    """The bridge and hosts of one reservation (kept in its state folder to remove them later)."""

    tag: str
    bridge: str
    bridge_ip: str
    prefix: int
    hosts: tuple[NetnsHost, ...]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "NetnsPlan":
        return cls(d["tag"], d["bridge"], d["bridge_ip"], int(d["prefix"]),
                   tuple(NetnsHost(**h) for h in d["hosts"]))


def unavailable() -> str:
    """Why namespaces cannot be made here ("" when they can): for errors and test skips."""
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, or serve without --netns)"
    for tool, pkg in (("ip", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"network namespaces need `{tool}` (apt-get install {pkg})"
    return ""


def plan(tag: str, hosts: int, subnet: str = "10.213.0.0/24") -> NetnsPlan:
    """Names and addresses for ``hosts`` hosts on ``subnet`` (pure: nothing is created)."""
    net = ipaddress.ip_network(subnet)
    if hosts + _FIRST_HOST >= net.num_addresses - 1:
        raise NetnsError(f"{hosts} hosts do not fit in {subnet}", "ask for fewer hosts")
    addrs = list(net.hosts())
    return NetnsPlan(
        tag=tag, bridge=f"mnb{tag}", bridge_ip=str(addrs[0]), prefix=net.prefixlen,
        hosts=tuple(NetnsHost(f"monarch-{tag}-h{i}", str(addrs[_FIRST_HOST - 1 + i]), f"mnv{tag}-{i}")
                    for i in range(hosts)))


def create(tag: str, hosts: int) -> NetnsPlan:
    """Make a bridge and ``hosts`` namespaces on the first free subnet; all or nothing."""
    why = unavailable()
    if why:
        raise NetnsError(why)
    if len(tag) > 8 or not tag.isalnum():
        raise NetnsError(f"bad namespace tag {tag!r}")  # interface names are at most 15 bytes
    os.makedirs(os.path.dirname(_LOCK), exist_ok=True)
    with open(_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        p = plan(tag, hosts, _free_subnet())
        try:
            _ip("link", "add", p.bridge, "type", "bridge")
            _ip("addr", "add", f"{p.bridge_ip}/{p.prefix}", "dev", p.bridge)
            _ip("link", "set", p.bridge, "up")
            for h in p.hosts:
                _ip("netns", "add", h.netns)
                _ip("link", "add", h.link, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
                _ip("link", "set", h.link, "master", p.bridge, "up")
                _ip("-n", h.netns, "addr", "add", f"{h.ip}/{p.prefix}", "dev", "eth0")
                _ip("-n", h.netns, "link", "set", "eth0", "up")
                _ip("-n", h.netns, "link", "set", "lo", "up")
        except BaseException:
            remove(p)
            raise
    return p


def remove(p: NetnsPlan) -> None:
    """Remove the namespaces and the bridge (their veth pairs go with them). Safe to call twice."""
    for h in p.hosts:
        _ip("netns", "del", h.netns, check=False)
        _ip("link", "del", h.link, check=False)  # gone with its peer already, unless creation stopped halfway
    _ip("link", "del", p.bridge, check=False)


def set_link(host: NetnsHost, up: bool) -> None:
    """Cut (``up=False``) or restore a host's only link, as a pulled cable would."""
    _ip("link", "set", host.link, "up" if up else "down")


def hosts_file(p: NetnsPlan, names: list[str]) -> str:
    """An ``/etc/hosts`` for the hosts of ``p`` named ``names`` (what a cluster's DNS would answer)."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback", f"{p.bridge_ip} monarch-client"]
    lines += [f"{h.ip} {n}" for h, n in zip(p.hosts, names)]
    return "\n".join(lines) + "\n"


def enter_argv(host: NetnsHost, argv: list[str], hostname: str = "", hosts_path: str = "") -> list[str]:
    """``argv`` run inside ``host``'s network namespace, optionally under its own hostname.

    ``nsenter``, not ``ip netns exec``, which remounts /sys.  With ``hostname``
    the host also gets its own UTS and mount namespaces, in which ``hosts_path``
    is bound over ``/etc/hosts``: the name resolves to the host's own address, as
    torchrun and Gloo expect of a machine (with the machine's name they would
    advertise an address the other hosts cannot reach).
    """
    enter = ["nsenter", f"--net={host.path}", "--"]
    if not hostname:
        return [*enter, *argv]
    script = 'name=$0 hosts=$1; shift; hostname "$name" && mount --bind "$hosts" /etc/hosts && exec "$@"'
    return [*enter, "unshare", "--uts", "--mount", "--", "sh", "-c", script, hostname, hosts_path, *argv]


def exists(p: NetnsPlan) -> bool:
    return any(os.path.exists(h.path) for h in p.hosts)


def _free_subnet() -> str:
    """The first /24 of :data:`SUPERNET` that no route or address on this machine overlaps."""
    used = []
    out = subprocess.run(["ip", "-j", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    for r in json.loads(out or "[]"):
        dst = r.get("dst", "")
        if dst and dst not in ("default", "broadcast"):
            try:
                used.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                pass
    for net in ipaddress.ip_network(SUPERNET).subnets(new_prefix=24):
        if not any(net.overlaps(u) for u in used):
            return str(net)
    raise NetnsError(f"every /24 of {SUPERNET} is in use", "`monarch stop` reservations made with --netns")


def _ip(*args: str, check: bool = True) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {r.stderr.strip() or r.returncode}")

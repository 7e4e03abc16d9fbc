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

The test Slurm cluster (``scripts/slurm_cluster.sh``) takes its subnets from
``10.231.0.0/16`` (:data:`SLURM_SUPERNET`) through this file's command line,
which needs nothing but the standard library, so any ``python3`` runs it::

    python3 -P monarch_schedulers/netns.py create TAG HOSTS SUPERNET PLAN.json   # prints: BRIDGE_IP IP...
    python3 -P monarch_schedulers/netns.py hosts PLAN.json NAME...              # an /etc/hosts for them
    python3 -P monarch_schedulers/netns.py exec PLAN.json I HOSTNAME HOSTS_FILE -- ARGV...
    python3 -P monarch_schedulers/netns.py remove TAG                          # by name: safe after a crash
    python3 -P monarch_schedulers/netns.py check                               # exit 1 + why, if unavailable

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
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

#: The /16 that subnets are taken from (a /24 per reservation).
SUPERNET = "10.213.0.0/16"
#: The /16 of the test Slurm clusters' bridges (a /24 per cluster), apart from reservations'.
SLURM_SUPERNET = "10.231.0.0/16"
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


def create(tag: str, hosts: int, supernet: str = SUPERNET) -> NetnsPlan:
    """Make a bridge and ``hosts`` namespaces on the first free /24 of ``supernet``; all or nothing."""
    why = unavailable()
    if why:
        raise NetnsError(why)
    if len(tag) > 8 or not tag.isalnum():
        raise NetnsError(f"bad namespace tag {tag!r}")  # interface names are at most 15 bytes
    os.makedirs(os.path.dirname(_LOCK), exist_ok=True)
    # The lock lives in a folder anyone may write (/run/lock, /tmp): never through a link someone
    # put there, and only a file of ours (another user holding a lock on theirs would stall us).
    try:
        fd = os.open(_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise NetnsError(f"cannot open the namespace lock {_LOCK}: {e.strerror}", f"remove it (`rm {_LOCK}`)") from None
    if os.fstat(fd).st_uid != os.getuid():
        os.close(fd)
        raise NetnsError(f"{_LOCK} belongs to another user", f"remove it (`rm {_LOCK}`) and run the command again")
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        p = plan(tag, hosts, _free_subnet(supernet))
        try:
            # One `ip -batch` for the machine's side and one per namespace, not six `ip` per host
            # (64 hosts: 1.4 s of `ip` starts on a loaded 2-core machine).
            root = [f"link add {p.bridge} type bridge", f"addr add {p.bridge_ip}/{p.prefix} dev {p.bridge}",
                    f"link set {p.bridge} up"]
            for h in p.hosts:
                root += [f"netns add {h.netns}", f"link add {h.link} type veth peer name eth0 netns {h.netns}",
                         f"link set {h.link} master {p.bridge} up"]
            _batch(root)
            inside = [[f"addr add {h.ip}/{p.prefix} dev eth0", "link set eth0 up", "link set lo up"] for h in p.hosts]
            with ThreadPoolExecutor(min(8, max(1, len(p.hosts)))) as pool:
                list(pool.map(lambda h, cmds: _batch(cmds, netns=h.netns), p.hosts, inside))
        except BaseException:
            remove(p)
            raise
    return p


def remove(p: NetnsPlan) -> None:
    """Remove the namespaces and the bridge (their veth pairs go with them). Safe to call twice."""
    # The veth ends too: gone with their peers already, unless creation stopped halfway.
    _batch([*(f"netns del {h.netns}" for h in p.hosts), *(f"link del {h.link}" for h in p.hosts),
            f"link del {p.bridge}"], check=False)


def remove_tag(tag: str) -> None:
    """Remove every namespace and link :func:`create` names for ``tag``, found by name.

    For a creator that died before it could keep its plan: what it left is found
    without knowing the subnet or the number of hosts.
    """
    ns_re = re.compile(rf"monarch-{re.escape(tag)}-h\d+")
    link_re = re.compile(rf"mnv{re.escape(tag)}-\d+|mnb{re.escape(tag)}")
    for ns in _names(["netns", "list"]):
        if ns_re.fullmatch(ns):
            _ip("netns", "del", ns, check=False)
    links = _names(["link", "show"], key="ifname")
    for link in sorted(links, key=lambda n: n.startswith("mnb")):  # the bridge last
        if link_re.fullmatch(link):
            _ip("link", "del", link, check=False)


def left_by(tag: str) -> list[str]:
    """The namespaces and links of ``tag`` that still exist (empty once :func:`remove_tag` is done)."""
    ns_re = re.compile(rf"monarch-{re.escape(tag)}-h\d+")
    link_re = re.compile(rf"mnv{re.escape(tag)}-\d+|mnb{re.escape(tag)}")
    return ([f"netns {n}" for n in _names(["netns", "list"]) if ns_re.fullmatch(n)]
            + [f"link {n}" for n in _names(["link", "show"], key="ifname") if link_re.fullmatch(n)])


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


def _free_subnet(supernet: str = SUPERNET) -> str:
    """The first /24 of ``supernet`` that no route or address on this machine overlaps."""
    used = []
    out = subprocess.run(["ip", "-j", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    for r in json.loads(out or "[]"):
        dst = r.get("dst", "")
        if dst and dst not in ("default", "broadcast"):
            try:
                used.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                pass
    for net in ipaddress.ip_network(supernet).subnets(new_prefix=24):
        if not any(net.overlaps(u) for u in used):
            return str(net)
    raise NetnsError(f"every /24 of {supernet} is in use", "`monarch stop` reservations made with --netns")


def _batch(commands: list[str], *, netns: str = "", check: bool = True) -> None:
    """Run ``ip`` commands (one per line) in one ``ip -batch`` (in ``netns``); ``check=False``: every
    line is tried (``-force``) and failures are ignored."""
    argv = ["ip", *(["-n", netns] if netns else []), *([] if check else ["-force"]), "-batch", "-"]
    r = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True)
    if check and r.returncode != 0:
        raise NetnsError(f"`ip{' -n ' + netns if netns else ''}` failed: {r.stderr.strip() or r.returncode}")


def _ip(*args: str, check: bool = True) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {r.stderr.strip() or r.returncode}")


def _names(args: list[str], key: str = "name") -> list[str]:
    """The names ``ip -j ARGS`` lists (``[]`` where there are none: ``ip`` prints nothing then)."""
    r = subprocess.run(["ip", "-j", *args], capture_output=True, text=True)
    try:
        return [str(d[key]) for d in json.loads(r.stdout or "[]") if key in d]
    except (ValueError, TypeError):
        return []


# -- command line (for scripts/slurm_cluster.sh) ------------------------------------------------


def main(argv: list[str]) -> int:
    """``netns.py create|hosts|exec|remove|check ...`` (see the module docstring)."""
    cmd, args = (argv[0], argv[1:]) if argv else ("", [])
    try:
        if cmd == "check" and not args:
            why = unavailable()
            if why:
                print(why, file=sys.stderr)
            return 1 if why else 0
        if cmd == "create" and len(args) == 4 and args[1].isdigit():
            tag, hosts, supernet, plan_file = args
            p = create(tag, int(hosts), supernet)
            try:
                tmp = f"{plan_file}.tmp"
                with open(tmp, "w") as f:
                    json.dump(p.to_json(), f)
                os.replace(tmp, plan_file)
            except OSError as e:
                remove(p)
                raise NetnsError(f"cannot write {plan_file}: {e.strerror}") from None
            print(p.bridge_ip, *(h.ip for h in p.hosts))
            return 0
        if cmd == "hosts" and len(args) >= 2:
            sys.stdout.write(hosts_file(_load(args[0]), args[1:]))
            return 0
        if cmd == "exec" and len(args) >= 6 and args[1].isdigit() and args[4] == "--":
            p = _load(args[0])
            i = int(args[1])
            if i >= len(p.hosts):
                raise NetnsError(f"{args[0]} has no host {i}")
            argv = enter_argv(p.hosts[i], args[5:], hostname=args[2], hosts_path=args[3])
            os.execvp(argv[0], argv)
        if cmd == "remove" and len(args) == 1:
            remove_tag(args[0])
            # A namespace's veth end on the bridge side goes away asynchronously.
            deadline = time.monotonic() + 3
            while (left := left_by(args[0])) and time.monotonic() < deadline:
                time.sleep(0.05)
                remove_tag(args[0])
            if left:
                raise NetnsError(f"still there after removal: {', '.join(left)}")
            return 0
    except NetnsError as e:
        print(f"netns: error: {e.message}" + (f" ({e.hint})" if e.hint else ""), file=sys.stderr)
        return 1
    print("usage: netns.py create TAG HOSTS SUPERNET PLAN.json | hosts PLAN.json NAME... |"
          " exec PLAN.json I HOSTNAME HOSTS_FILE -- ARGV... | remove TAG | check", file=sys.stderr)
    return 2


def _load(plan_file: str) -> NetnsPlan:
    try:
        with open(plan_file) as f:
            return NetnsPlan.from_json(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise NetnsError(f"cannot read the plan {plan_file}: {e}") from None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Enter a simulated host's namespaces from inside this process: the fork launcher's ``--netns`` hosts.

``monarch serve --netns`` gives each local host a network namespace of its own
(``monarch_schedulers/netns.py`` makes them).  The local launcher forks every host
agent from one warm interpreter (``host_agent.fork_hosts``); a forked agent calls
:func:`enter` before anything else, which does what ``nsenter --net=NS unshare --uts
--mount sh -c 'hostname NAME && mount --bind HOSTS /etc/hosts'`` did for a host
started as a new interpreter: the same namespaces, without two interpreters and three
helper programs per host.

It must run while the process has one thread (right after ``fork``): the kernel
refuses a new mount namespace to a thread that shares its filesystem context.
Python 3.11 has no ``os.setns``/``os.unshare``: libc's, through ctypes.
"""

from __future__ import annotations

import ctypes
import os

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWNET = 0x40000000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter(netns: str, hostname: str = "", hosts_file: str = "") -> None:
    """Move this process into the network namespace at ``netns`` (``/run/netns/NAME``).

    With ``hostname``, also into a UTS and a mount namespace of its own: the host's name is
    ``hostname`` and ``hosts_file`` is bound over ``/etc/hosts`` there, so the name resolves to
    the host's own address (torchrun and Gloo advertise what the host's name resolves to).
    Everything this process starts afterwards (the zygote, procs, ranks) is in them too.
    """
    libc = _libc()
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(fd, _CLONE_NEWNET), f"setns {netns}")
    finally:
        os.close(fd)
    if not hostname:
        return
    _check(libc.unshare(_CLONE_NEWUTS | _CLONE_NEWNS), "unshare (uts, mount)")
    # As `unshare --mount` does: the bind below must not propagate back to the machine's mounts.
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    name = hostname.encode()
    _check(libc.sethostname(name, len(name)), f"sethostname {hostname}")
    if hosts_file:
        _check(libc.mount(hosts_file.encode(), b"/etc/hosts", None, _MS_BIND, None),
               f"mount --bind {hosts_file} /etc/hosts")

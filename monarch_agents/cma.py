"""Cross-memory attach: copy bytes straight out of another process of this host.

``process_vm_readv(2)`` copies from a range of another process's memory into
ours in one kernel call, without the other process doing anything: on one host
it is what an RDMA read is between hosts (MPI uses it the same way for its
intra-node messages).  The kernel allows it only where ``ptrace`` would be
allowed (same user, and what Yama's ``ptrace_scope`` says); where it is refused
the caller falls back to asking the owner for the bytes.

A pid alone could name another process once the first has died, so a peer is
held as a *pidfd* opened while the process was known to be the right one (its
start time checked); after a copy, a pidfd that reports the process has exited
means the bytes may not be its own, and the copy is refused.

What this module does not do: write into another process (a write into memory
its owner has just freed would corrupt it; writes go through the owner), or
cross hosts.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import select
import threading

__all__ = ["Peer", "PeerGone", "host_key", "local_copy", "peer"]


class PeerGone(Exception):
    """The process to copy from has exited (or is no longer the one that was named)."""


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    f = libc.process_vm_readv
    f.argtypes = (ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                  ctypes.c_ulong)
    f.restype = ctypes.c_ssize_t
    return libc


@functools.cache
def host_key() -> str:
    """Who shares memory with whom: one boot of one kernel, one network and pid namespace.

    Two processes with the same key are on one host (a ``--netns`` rehearsal host has its own
    network namespace, so its peers count as other hosts, as they would on a cluster).
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    parts = [boot]
    for ns in ("net", "pid"):
        try:
            parts.append(str(os.stat(f"/proc/self/ns/{ns}").st_ino))
        except OSError:
            parts.append("?")
    return ":".join(parts)


def start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); -1 if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return -1
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    return int(stat[stat.rindex(b")") + 2:].split()[19])


class Peer:
    """Another process of this host, held by a pidfd so that its pid cannot be mistaken."""

    def __init__(self, pid: int, started: int):
        self.pid = pid
        self.started = started
        self._fd = -1
        try:
            self._fd = os.pidfd_open(pid)
        except OSError as e:
            raise PeerGone(f"process {pid} is gone ({os.strerror(e.errno or 0)})") from None
        if start_time(pid) != started:
            os.close(self._fd)
            self._fd = -1
            raise PeerGone(f"process {pid} is gone (its pid now names another process)")

    def alive(self) -> bool:
        if self._fd < 0:
            return False
        p = select.poll()
        p.register(self._fd, select.POLLIN)
        return not p.poll(0)  # a pidfd becomes readable when its process exits

    def read(self, remote_addr: int, local_addr: int, n: int) -> None:
        """Copy ``n`` bytes at ``remote_addr`` in the peer to ``local_addr`` here.

        Raises :class:`PeerGone` if it exited, ``PermissionError`` where the kernel refuses
        (``ptrace_scope``), ``OSError(EFAULT)`` if the range is not mapped there.
        """
        libc = _libc()
        done = 0
        while done < n:
            local = _IOVec(local_addr + done, n - done)
            remote = _IOVec(remote_addr + done, n - done)
            got = libc.process_vm_readv(self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if got < 0:
                err = ctypes.get_errno()
                if err == errno.ESRCH or not self.alive():
                    raise PeerGone(f"process {self.pid} exited")
                if err == errno.EPERM:
                    raise PermissionError(err, "reading another process's memory is not allowed here (ptrace_scope)")
                raise OSError(err, os.strerror(err))
            if got == 0:
                raise OSError(errno.EFAULT, "no bytes could be read (range not mapped)")
            done += got
        if not self.alive():
            raise PeerGone(f"process {self.pid} exited during the copy")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


_peers: dict[tuple[int, int], Peer] = {}
_peers_lock = threading.Lock()


def peer(pid: int, started: int) -> Peer:
    """The :class:`Peer` for ``(pid, started)``, opened once per process."""
    key = (pid, started)
    with _peers_lock:
        p = _peers.get(key)
        if p is not None and p.alive():
            return p
        if p is not None:
            del _peers[key]
            p.close()
            raise PeerGone(f"process {pid} exited")
        p = _peers[key] = Peer(pid, started)
        if len(_peers) > 1024:  # exited peers are dropped as they are met; bound the rest
            for k in list(_peers)[:256]:
                _peers.pop(k).close()
        return p


def local_copy(dst_addr: int, src_addr: int, n: int) -> None:
    """``memmove`` within this process."""
    ctypes.memmove(dst_addr, src_addr, n)

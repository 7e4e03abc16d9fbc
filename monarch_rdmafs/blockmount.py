"""The owner's side of a block mount (see :mod:`monarch_rdmafs.blockfs`): start the mount process,
hand it blocks and new trees, hear which blocks its readers wait for.

    m = BlockMount(index, total_size, "/abs/mnt", on_fault=lambda block: ...)
    addr = m.block_ptr(0)            # 64 MiB of shared memory to fill (ctypes address)
    ...                              # write block 0's bytes there
    m.receive_block(0, stale=[])     # served from now on; readers waiting for it wake
    m.refresh(new_index, new_total)  # the new tree, in one step
    m.unmount()

A block's memory is a memfd mapped here read-write and in the mount process read-only: the
bytes written at ``block_ptr`` are the bytes served, never copied.  ``on_fault(block)`` runs on a
thread of its own (it may call ``receive_block``), once each time a reader starts waiting for a
block nobody was waiting for.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

from monarch_rdmafs.blockfs import BLOCK_SIZE, frame, recv_frame
from monarch_rdmafs.mount import is_mounted, unmount

log = logging.getLogger("monarch.rdmafs.blockmount")

_READY_TIMEOUT_S = 30.0
_REPLY_TIMEOUT_S = 120.0
_STOP_TIMEOUT_S = 10.0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_PROT_READ, _PROT_WRITE, _MAP_SHARED = 1, 2, 1
_MAP_FAILED = ctypes.c_void_p(-1).value


class MountFailed(RuntimeError):
    """The mount could not be made, or its process stopped answering."""


class _Buffer:
    """One block's shared memory: its descriptor and where it is mapped here."""

    def __init__(self, block: int):
        self.fd = os.memfd_create(f"monarch-block-{block}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, BLOCK_SIZE)
            addr = _libc.mmap(None, BLOCK_SIZE, _PROT_READ | _PROT_WRITE, _MAP_SHARED, self.fd, 0)
            if addr in (None, _MAP_FAILED):
                err = ctypes.get_errno()
                raise OSError(err, f"cannot map block {block}: {os.strerror(err)}")
        except BaseException:
            os.close(self.fd)
            raise
        self.addr: int = addr

    def release(self) -> None:
        if self.addr:
            _libc.munmap(self.addr, BLOCK_SIZE)
            self.addr = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class BlockMount:
    """A block mount at ``mountpoint`` (an absolute path to an existing folder of this user)."""

    def __init__(self, index: dict, total_size: int, mountpoint: str,
                 on_fault: Optional[Callable[[int], Any]] = None, fsname: str = "monarch-remotemount"):
        if not isinstance(mountpoint, str) or not os.path.isabs(mountpoint):
            raise MountFailed(f"mount point must be an absolute path, not {mountpoint!r}")
        try:
            st = os.stat(mountpoint)
        except OSError as e:
            raise MountFailed(f"cannot mount at {mountpoint}: {e.strerror}") from None
        if not os.path.isdir(mountpoint):
            raise MountFailed(f"cannot mount at {mountpoint}: not a directory")
        if st.st_uid != os.getuid():
            raise MountFailed(f"cannot mount at {mountpoint}: it belongs to another user (uid {st.st_uid})")
        self.mountpoint = mountpoint
        self._on_fault = on_fault
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Buffer] = {}
        self._held: dict[int, _Buffer] = {}
        self._replies: dict[int, "queue.Queue[dict]"] = {}
        self._seq = 0
        self._faults: "queue.Queue[int | None]" = queue.Queue()
        self._closed = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", "monarch_rdmafs.blockfs", "--fd", str(theirs.fileno())],
                                          pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._send({"mountpoint": mountpoint, "index": index, "total": int(total_size), "fsname": fsname})
        ready = queue.Queue()
        self._replies[-1] = ready
        self._reader = threading.Thread(target=self._read, name=f"blockmount {mountpoint}", daemon=True)
        self._reader.start()
        try:
            answer = ready.get(timeout=_READY_TIMEOUT_S)
        except queue.Empty:
            answer = {"op": "error", "message": f"no answer in {_READY_TIMEOUT_S:.0f} s"}
        if answer.get("op") != "ready":
            self._stop_process()
            raise MountFailed(f"cannot mount at {mountpoint}: {answer.get('message', 'the mount process ended')}")
        self._caller = threading.Thread(target=self._call_faults, name=f"blockmount faults {mountpoint}", daemon=True)
        self._caller.start()

    # -- the API -----------------------------------------------------------------

    def block_ptr(self, block: int) -> int:
        """The address of ``BLOCK_SIZE`` bytes of shared memory to write block ``block`` into (reserved
        on first call; :meth:`receive_block` serves it)."""
        block = int(block)
        with self._lock:
            self._check_open()
            buf = self._pending.get(block)
            if buf is None:
                buf = self._pending[block] = _Buffer(block)
            return buf.addr

    def receive_block(self, block: int, stale: list[str]) -> None:
        """Serve what was written at ``block_ptr(block)`` as block ``block``; the files ``stale`` names read EIO."""
        block = int(block)
        with self._lock:
            self._check_open()
            buf = self._pending.pop(block, None)
        if buf is None:
            raise ValueError(f"block {block} has no buffer: call block_ptr({block}) and fill it first")
        try:
            self._request({"op": "receive", "block": block, "stale": [str(s) for s in stale]}, [buf.fd])
        except BaseException:
            buf.release()
            raise
        os.close(buf.fd)  # the mapping keeps the memory; the mount process has its own descriptor
        buf.fd = -1
        with self._lock:
            old = self._held.pop(block, None)
            self._held[block] = buf
        if old is not None:
            old.release()

    def refresh(self, index: dict, total_size: int) -> None:
        """Serve ``index`` from now on (one step); what the kernel cached of changed paths is forgotten."""
        self._check_open()
        self._request({"op": "refresh", "index": index, "total": int(total_size)}, [])

    def unmount(self) -> None:
        """Unmount and end the mount process (safe to call twice)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._send({"op": "unmount"})
        except OSError:
            pass
        self._stop_process()
        with self._lock:
            bufs = list(self._pending.values()) + list(self._held.values())
            self._pending.clear()
            self._held.clear()
        for b in bufs:
            b.release()

    @property
    def alive(self) -> bool:
        return not self._closed and self._proc.poll() is None

    # -- internals ---------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise MountFailed(f"the mount at {self.mountpoint} is unmounted")

    def _send(self, obj: Any, fds: list[int] = ()) -> None:
        head, body = frame(obj, len(fds))
        with self._send_lock:
            if fds:
                socket.send_fds(self._sock, [head], list(fds))
            else:
                self._sock.sendall(head)
            self._sock.sendall(body)

    def _request(self, msg: dict, fds: list[int]) -> None:
        with self._lock:
            self._seq += 1
            seq = msg["seq"] = self._seq
            q: queue.Queue = queue.Queue()
            self._replies[seq] = q
        try:
            try:
                self._send(msg, fds)
            except OSError as e:
                raise MountFailed(f"the mount at {self.mountpoint} stopped: {e}") from None
            try:
                answer = q.get(timeout=_REPLY_TIMEOUT_S)
            except queue.Empty:
                raise MountFailed(f"the mount at {self.mountpoint} did not answer in {_REPLY_TIMEOUT_S:.0f} s") from None
        finally:
            with self._lock:
                self._replies.pop(seq, None)
        if answer.get("op") != "ack":
            raise MountFailed(f"the mount at {self.mountpoint}: {answer.get('message', 'the mount process ended')}")

    def _read(self) -> None:
        while True:
            try:
                got = recv_frame(self._sock)
            except OSError:
                got = None
            if got is None:
                break
            msg, fds = got
            for fd in fds:
                os.close(fd)
            op = msg.get("op")
            if op == "fault":
                self._faults.put(int(msg["block"]))
                continue
            key = -1 if op in ("ready", "error") else msg.get("seq")
            with self._lock:
                q = self._replies.get(key)
            if q is not None:
                q.put(msg)
        # The mount process is gone: every request waiting fails, and so do later ones.
        with self._lock:
            waiting = list(self._replies.values())
        for q in waiting:
            q.put({"op": "error", "message": "the mount process ended"})
        self._faults.put(None)

    def _call_faults(self) -> None:
        while True:
            block = self._faults.get()
            if block is None:
                return
            if self._on_fault is None:
                continue
            try:
                self._on_fault(block)
            except Exception:
                log.exception("the fault callback of %s failed for block %d", self.mountpoint, block)

    def _stop_process(self) -> None:
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        try:
            self._sock.shutdown(socket.SHUT_WR)  # its lifeline: it unmounts and ends
        except OSError:
            pass
        try:
            self._proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if is_mounted(self.mountpoint):
            unmount(self.mountpoint)
        self._reader.join(max(0.1, deadline - time.monotonic()))
        self._sock.close()

    def __repr__(self) -> str:
        return f"BlockMount({self.mountpoint!r}, {'mounted' if self.alive else 'unmounted'})"

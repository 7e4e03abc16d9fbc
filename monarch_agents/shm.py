"""Shared-memory segments for large buffers between procs of one host.

A large buffer bound for a process on this host is written once into a
*segment*, an anonymous memory file (``memfd_create``), whose descriptor
travels with the message over the Unix socket (``SCM_RIGHTS``, see
``monarch_agents/ipc.py``).  The receiver maps it: tensors and arrays are built on that
mapping without another copy.

Segments have no name, so none can be left behind: the kernel frees one when
the last process holding its descriptor or a mapping of it lets go, including
when a peer dies with messages still queued to it.

Fresh tmpfs pages cost a page fault each (most of the time of a 64 MiB
transfer), so segments are recycled: when the objects built on a received
segment are gone, its descriptor goes into this process's :class:`Pool`, and the
next large send reuses it with its pages already in place.  A segment is only
ever held by one process at a time (the sender closes its descriptor once the
message is sent), so recycling never changes memory someone else still reads.
Going further, each process keeps its own mapping of the large segments it
has written or read (:class:`_Maps`): a segment that comes back (an echo, a
training step's tensors) is then copied in and out at memory speed, with no
fault at all.  Such a mapping is only touched by its process while that
process holds the segment, and only within the segment's current size.

What this module does not do: share memory between hosts, or hand the same
segment to two processes.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import weakref
from typing import Any

#: The pool keeps at most this many idle segments, and at most this many bytes in them.
POOL_SEGMENTS = 8
POOL_BYTES = 512 << 20
_HUGE = 2 << 20
_MADV_HUGEPAGE = 14


class Mapping(mmap.mmap):
    """A received segment, mapped; knows its descriptor so it can be read without faulting it in."""

    fd: int
    length: int


class Pool:
    """Idle segments of this process, by capacity (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[tuple[int, int]] = []  # (capacity, fd)
        self._pid = os.getpid()

    def take(self, n: int) -> int:
        """A segment of exactly ``n`` bytes: a recycled one when possible, or a new one.

        Segments are sealed against shrinking (see :func:`seal`), so one is reused
        at its own size or grown, never cut down.
        """
        fd, cap = -1, 0
        with self._lock:
            if self._idle:
                fits = [s for s in self._idle if s[0] == n] or [s for s in self._idle if s[0] < n]
                if fits:
                    # The one that fits exactly; else the largest smaller one, whose pages are reused as far as they go.
                    cap, fd = max(fits)
                    self._idle.remove((cap, fd))
        if fd < 0:
            fd = os.memfd_create("monarch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        if cap != n:
            os.ftruncate(fd, n)
        return fd

    def give(self, fd: int, capacity: int) -> None:
        """Keep ``fd`` (a segment of ``capacity`` bytes) for reuse, or close it if the pool is full."""
        if os.getpid() != self._pid:  # a forked child: these descriptors are the parent's
            return
        with self._lock:
            held = sum(c for c, _ in self._idle)
            if len(self._idle) < POOL_SEGMENTS and held + capacity <= POOL_BYTES:
                self._idle.append((capacity, fd))
                return
        os.close(fd)

    def clear(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for _, fd in idle:
            os.close(fd)

    def statistics(self) -> dict:
        with self._lock:
            return {"idle_segments": len(self._idle), "idle_bytes": sum(c for c, _ in self._idle),
                    "mapped_segments": len(_maps._maps)}


_pool: Pool | None = None
_pool_lock = threading.Lock()


def pool() -> Pool:
    """This process's pool (a fresh, empty one after fork)."""
    global _pool
    p = _pool
    if p is None or p._pid != os.getpid():
        with _pool_lock:
            if _pool is None or _pool._pid != os.getpid():
                _pool = Pool()
            p = _pool
    return p


class _Maps:
    """This process's mappings of large segments, by inode, least recently used first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: dict[tuple[int, int], mmap.mmap] = {}
        self._pid = os.getpid()

    def get(self, fd: int, n: int) -> mmap.mmap | None:
        if self._pid != os.getpid():  # a forked child starts with none of its own
            with self._lock:
                self._maps, self._pid = {}, os.getpid()
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            m = self._maps.pop(key, None)
            if m is not None and len(m) >= n and st.st_size >= n:
                self._maps[key] = m  # most recent last
                return m
        return None

    def keep(self, fd: int, n: int) -> None:
        """Map ``fd`` for next time (lazily: no page is touched now)."""
        st = os.fstat(fd)
        m = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with self._lock:
            self._maps[(st.st_dev, st.st_ino)] = m
            held = sum(len(x) for x in self._maps.values())
            while held > POOL_BYTES and len(self._maps) > 1:
                old = self._maps.pop(next(iter(self._maps)))
                held -= len(old)
                try:
                    old.close()
                except BufferError:  # still being copied from: it goes when that is done
                    pass


_maps = _Maps()


def write(raw: memoryview) -> int:
    """A segment holding a copy of ``raw``; the caller owns (and must send or close) the descriptor."""
    view = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
    n = view.nbytes
    fd = pool().take(n)
    try:
        m = _maps.get(fd, n) if n >= _HUGE else None
        if m is not None:
            memoryview(m)[:n] = view
        else:
            done = 0
            while done < n:
                done += os.pwrite(fd, view[done:], done)
            if n >= _HUGE:
                _maps.keep(fd, n)
        seal(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


#: A sent segment can no longer shrink: a receiver maps it whole, and a mapping past the end of
#: a file faults (SIGBUS) on access.  It may still grow (the pool reuses segments that way).
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL


def seal(fd: int) -> None:
    """Make the segment ``fd`` impossible to shrink, by anyone, for the rest of its life."""
    if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)


def read(fd: int, length: int) -> memoryview:
    """Map a received segment (taking over ``fd``); it returns to the pool once unused.

    A segment whose size is not ``length``, or that its sender could still
    shrink, is refused: a mapping past the end of the file would fault on access.
    """
    try:
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:  # not a memory file at all
            seals = 0
        if seals & fcntl.F_SEAL_SHRINK == 0:
            raise ValueError("segment is not sealed against shrinking")
        size = os.fstat(fd).st_size
        if size != length:
            raise ValueError(f"segment is {size} bytes, the message says {length}")
        if length == 0:
            os.close(fd)
            return memoryview(bytearray())
        m = Mapping(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    m.fd, m.length = fd, length
    weakref.finalize(m, pool().give, fd, length)
    return memoryview(m)


# --- bytes without page-by-page faults ---------------------------------------------

_native: tuple | None = None


def _native_calls() -> tuple:
    """(ctypes, PyBytes_FromStringAndSize, madvise or None), loaded on first use (ctypes is slow to import)."""
    global _native
    if _native is None:
        import ctypes

        make = ctypes.pythonapi.PyBytes_FromStringAndSize
        make.restype = ctypes.py_object
        make.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
        try:
            madvise = ctypes.CDLL(None, use_errno=True).madvise
            madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        except (OSError, AttributeError):
            madvise = None
        _native = (ctypes, make, madvise)
    return _native


def new_bytes(n: int) -> tuple[bytes, memoryview]:
    """A new ``bytes`` of ``n`` bytes, and a writable view of its contents to fill before anyone sees it.

    Huge pages are asked for first where the kernel gives them on request (see :func:`to_bytes`).
    :func:`to_bytes` of the view (or of a slice spanning it) is that ``bytes`` itself, with no copy.
    """
    ctypes, make, madvise = _native_calls()
    out = make(None, n)
    addr = id(out) + bytes.__basicsize__ - 1  # where a bytes object's data begins (CPython's layout)
    if madvise is not None and n >= _HUGE:
        lo, hi = -(-addr // _HUGE) * _HUGE, (addr + n) // _HUGE * _HUGE
        if hi > lo:
            madvise(lo, hi - lo, _MADV_HUGEPAGE)
    arr = (ctypes.c_char * n).from_address(addr)
    arr.made_bytes = out  # keeps it alive as long as the view is, and tells to_bytes
    return out, memoryview(arr).cast("B")


def to_bytes(buf: Any) -> bytes:
    """``bytes(buf)``, faster for a large received segment.

    A new 64 MiB ``bytes`` costs 16k page faults, more than the copy itself;
    asking for huge pages first (where the kernel offers them on request) makes
    that 32.  And a segment is read with ``preadv`` rather than through its
    mapping, which would fault every page in a second time.
    """
    mv = memoryview(buf)
    src = mv.obj
    made = getattr(src, "made_bytes", None)
    if made is not None and mv.nbytes == len(made):
        return made  # filled by its maker (new_bytes) already: no copy
    if not isinstance(src, Mapping) or mv.nbytes < _HUGE or not mv.c_contiguous or mv.nbytes != src.length:
        return bytes(mv)
    n = mv.nbytes
    out, dst = new_bytes(n)
    m = _maps.get(src.fd, n)
    if m is not None:
        dst[:] = memoryview(m)[:n]
        return out
    done = 0
    while done < n:
        got = os.preadv(src.fd, [dst[done:]], done)
        if got <= 0:
            raise OSError("segment shorter than its message said")
        done += got
    _maps.keep(src.fd, n)
    return out

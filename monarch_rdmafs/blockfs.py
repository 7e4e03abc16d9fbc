"""The mount process of a block mount (``monarch.remotemount``'s FUSE filesystem): a read-only tree
whose file bytes live in fixed-size blocks that arrive on demand.

The tree is PyTorch Monarch's remotemount index (virtual path -> node: ``attr``, ``children`` for
a folder, ``link_target`` for a link, ``global_offset`` + ``file_len`` for a file): every file is a
range of one packed byte stream cut into :data:`BLOCK_SIZE` blocks.  The mount starts with no
block; a read that needs a block it lacks tells its owner (a ``fault``) and waits until the block
comes.  A block comes as a shared-memory file (memfd) the owner filled: it is mapped here
read-only, so its bytes are never copied between the two processes.

A refresh swaps the whole tree in one step; inode numbers belong to paths, so a file open across
a refresh reads the new bytes (Monarch's semantics), and the kernel is told to forget what it
cached of every path whose node changed.  A file delivered stale (its source changed under the
fence) reads EIO, also a read that was waiting for its block.

Run by :class:`monarch_rdmafs.blockmount.BlockMount` as ``python -m monarch_rdmafs.blockfs --fd N``
over a private socket pair: frames of ``(nfds, length)`` + a pickle (the only peer is the process
that started this one, the same user).  The socket is this process's lifeline: when it closes
(the owner unmounted, or died) the mount is unmounted and this process ends.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import logging
import mmap
import os
import pickle
import signal
import socket
import stat
import struct
from typing import Any

log = logging.getLogger("monarch.rdmafs.blockfs")

#: The unit of on-demand delivery: a file's byte at packed offset ``o`` is in block ``o // BLOCK_SIZE``.
BLOCK_SIZE = 64 * 1024 * 1024
SUBTYPE = "monarch-blockfs"
HEADER = struct.Struct("!IQ")
#: Names and attributes are kept by the kernel this long; every change is invalidated at a refresh.
_CACHE_TIMEOUT_S = 3600.0
#: A read waits this long for its block, asking again every _REFAULT_S, before it fails with EIO
#: (the owner is gone or cannot deliver): a reader is never parked for ever.
_PARK_LIMIT_S = 600.0
_REFAULT_S = 30.0
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
DIR, LINK, FILE = "d", "l", "f"


def kind_of(node: dict) -> str:
    if "children" in node:
        return DIR
    if "link_target" in node:
        return LINK
    return FILE


def parent_path(vpath: str) -> tuple[str, str]:
    head, _, name = vpath.rpartition("/")
    return head or "/", name


def child_path(parent: str, name: str) -> str:
    return ("" if parent == "/" else parent) + "/" + name


def _ns(t: Any) -> int:
    return int(t) if isinstance(t, int) and abs(t) > 10**15 else int(round(float(t) * 1e9))


def recv_frame(sock: socket.socket) -> tuple[Any, list[int]] | None:
    """One frame (its object and the descriptors that came with it), or None at the end."""
    head = b""
    fds: list[int] = []
    while len(head) < HEADER.size:
        data, got, _flags, _addr = socket.recv_fds(sock, HEADER.size - len(head), 8)
        if not data:
            for fd in got + fds:
                os.close(fd)
            return None
        head += data
        fds += got
    _nfds, length = HEADER.unpack(head)
    body = bytearray(length)
    view = memoryview(body)
    got_n = 0
    while got_n < length:
        n = sock.recv_into(view[got_n:])
        if not n:
            for fd in fds:
                os.close(fd)
            return None
        got_n += n
    return pickle.loads(body), fds


def frame(obj: Any, nfds: int = 0) -> tuple[bytes, bytes]:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(nfds, len(body)), body


class BlockFS:
    """The filesystem's state and operations (made a ``pyfuse3.Operations`` in :func:`main`)."""

    def __init__(self, index: dict, total_size: int, send: Any):
        import pyfuse3
        import trio

        super().__init__()
        self._pyfuse3 = pyfuse3
        self._trio = trio
        self.tree = index
        self.total_size = total_size
        self._send = send
        self._ino_of: dict[tuple[str, str], int] = {("/", DIR): pyfuse3.ROOT_INODE}
        self._path_of: dict[int, str] = {pyfuse3.ROOT_INODE: "/"}
        self._next_ino = itertools.count(pyfuse3.ROOT_INODE + 1)
        self._next_fh = itertools.count(1)
        self._handles: dict[int, str] = {}
        self.blocks: dict[int, mmap.mmap] = {}
        self._waiting: dict[int, Any] = {}
        #: vpath -> the packed offset it was delivered stale at (a refresh that moves it clears it).
        self.stale: dict[str, int | None] = {}

    # -- inodes and attributes ------------------------------------------------

    def _ino(self, vpath: str, node: dict) -> int:
        key = (vpath, kind_of(node))
        ino = self._ino_of.get(key)
        if ino is None:
            ino = self._ino_of[key] = next(self._next_ino)
            self._path_of[ino] = vpath
        return ino

    def _node(self, ino: int) -> tuple[str, dict]:
        vpath = self._path_of.get(ino)
        node = self.tree.get(vpath) if vpath is not None else None
        if node is None or self._ino_of.get((vpath, kind_of(node))) != ino:
            raise self._pyfuse3.FUSEError(errno.ENOENT)
        return vpath, node

    def _attrs(self, ino: int, node: dict) -> Any:
        a = node.get("attr", {})
        e = self._pyfuse3.EntryAttributes()
        e.st_ino = ino
        kind = kind_of(node)
        mode = int(a.get("st_mode", 0))
        fmt = {DIR: stat.S_IFDIR, LINK: stat.S_IFLNK, FILE: stat.S_IFREG}[kind]
        e.st_mode = fmt | stat.S_IMODE(mode) if stat.S_IFMT(mode) != fmt else mode
        e.st_nlink = int(a.get("st_nlink", 1))
        e.st_uid = int(a.get("st_uid", os.getuid()))
        e.st_gid = int(a.get("st_gid", os.getgid()))
        if kind == FILE:
            size = int(node.get("file_len", a.get("st_size", 0)))
        elif kind == LINK:
            size = len(os.fsencode(node["link_target"]))
        else:
            size = int(a.get("st_size", 0))
        e.st_size = size
        e.st_blksize = 4096
        e.st_blocks = (size + 511) // 512
        e.st_atime_ns = _ns(a.get("st_atime", 0))
        e.st_mtime_ns = _ns(a.get("st_mtime", 0))
        e.st_ctime_ns = _ns(a.get("st_ctime", 0))
        e.entry_timeout = _CACHE_TIMEOUT_S
        e.attr_timeout = _CACHE_TIMEOUT_S
        return e

    # -- operations -------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> Any:
        ppath, pnode = self._node(parent_inode)
        sname = os.fsdecode(name)
        if sname == ".":
            return self._attrs(parent_inode, pnode)
        if sname == "..":
            up = parent_path(ppath)[0]
            unode = self.tree.get(up)
            if unode is None:
                raise self._pyfuse3.FUSEError(errno.ENOENT)
            return self._attrs(self._ino(up, unode), unode)
        vpath = child_path(ppath, sname)
        node = self.tree.get(vpath)
        if node is None or kind_of(pnode) != DIR or sname not in pnode["children"]:
            raise self._pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(self._ino(vpath, node), node)

    async def getattr(self, inode: int, ctx: Any = None) -> Any:
        _vpath, node = self._node(inode)
        return self._attrs(inode, node)

    async def readlink(self, inode: int, ctx: Any = None) -> bytes:
        _vpath, node = self._node(inode)
        if kind_of(node) != LINK:
            raise self._pyfuse3.FUSEError(errno.EINVAL)
        return os.fsencode(node["link_target"])

    async def opendir(self, inode: int, ctx: Any = None) -> int:
        _vpath, node = self._node(inode)
        if kind_of(node) != DIR:
            raise self._pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        vpath, node = self._node(fh)
        names = list(node.get("children", []))
        for i in range(start_id, len(names)):
            cpath = child_path(vpath, names[i])
            child = self.tree.get(cpath)
            if child is None:
                continue
            if not self._pyfuse3.readdir_reply(token, os.fsencode(names[i]), self._attrs(self._ino(cpath, child), child),
                                               i + 1):
                break

    async def releasedir(self, fh: int) -> None:
        return None

    async def open(self, inode: int, flags: int, ctx: Any = None) -> Any:
        vpath, node = self._node(inode)
        if flags & _WRITE_FLAGS:
            raise self._pyfuse3.FUSEError(errno.EROFS)
        if kind_of(node) != FILE:
            raise self._pyfuse3.FUSEError(errno.EISDIR if kind_of(node) == DIR else errno.EINVAL)
        fh = next(self._next_fh)
        self._handles[fh] = vpath
        # keep_cache: what the kernel cached of an inode stays right until a refresh or a block
        # replacement says otherwise (both invalidate it).
        return self._pyfuse3.FileInfo(fh=fh, keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        vpath = self._handles.get(fh)
        node = self.tree.get(vpath) if vpath is not None else None
        if node is None or kind_of(node) != FILE:
            raise self._pyfuse3.FUSEError(errno.ENOENT)
        length = int(node.get("file_len", 0))
        end = min(off + size, length)
        if off >= end:
            return b""
        base = node.get("global_offset")
        if base is None or self._is_stale(vpath, node):
            raise self._pyfuse3.FUSEError(errno.EIO)
        g0, g1 = base + off, base + end
        for block in range(g0 // BLOCK_SIZE, (g1 - 1) // BLOCK_SIZE + 1):
            await self._have(block)
        if self._is_stale(vpath, node):
            raise self._pyfuse3.FUSEError(errno.EIO)
        parts = []
        pos = g0
        while pos < g1:
            block, inner = divmod(pos, BLOCK_SIZE)
            n = min(g1 - pos, BLOCK_SIZE - inner)
            parts.append(self.blocks[block][inner:inner + n])
            pos += n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def release(self, fh: int) -> None:
        self._handles.pop(fh, None)

    async def access(self, inode: int, mode: int, ctx: Any = None) -> bool:
        self._node(inode)
        return not mode & os.W_OK

    async def statfs(self, ctx: Any = None) -> Any:
        s = self._pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = (self.total_size + 4095) // 4096
        s.f_files = len(self.tree)
        s.f_namemax = 255
        return s

    # -- blocks -----------------------------------------------------------------

    def _is_stale(self, vpath: str, node: dict) -> bool:
        return vpath in self.stale and self.stale[vpath] == node.get("global_offset")

    async def _have(self, block: int) -> None:
        """Return once ``block`` is here, asking the owner for it (a fault) if no read asked yet."""
        trio = self._trio
        if block in self.blocks:
            return
        waited = 0.0
        while block not in self.blocks:
            ev = self._waiting.get(block)
            if ev is None:
                ev = self._waiting[block] = trio.Event()
                await self._send({"op": "fault", "block": block})
            with trio.move_on_after(_REFAULT_S):
                await ev.wait()
            if block in self.blocks:
                return
            waited += _REFAULT_S
            if self._waiting.get(block) is ev:
                del self._waiting[block]  # the next turn asks again
            if waited >= _PARK_LIMIT_S:
                log.warning("block %d never came in %.0f s: the read fails with EIO", block, waited)
                raise self._pyfuse3.FUSEError(errno.EIO)

    def receive(self, block: int, fd: int, stale: list[str]) -> list[int]:
        """Serve ``block`` from the memfd ``fd``; returns the inodes the kernel must forget (a replaced block)."""
        mm = mmap.mmap(fd, BLOCK_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        old = self.blocks.get(block)
        self.blocks[block] = mm
        marked = set()
        for v in stale:
            node = self.tree.get(v)
            self.stale[v] = node.get("global_offset") if node is not None else None
            marked.add(v)
        forget = []
        if old is not None:
            old.close()
            lo, hi = block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE
            for v, node in self.tree.items():
                off = node.get("global_offset")
                if off is None or off >= hi or off + int(node.get("file_len", 0)) <= lo:
                    continue
                if v not in marked and self.stale.get(v, -1) == off:
                    del self.stale[v]
                ino = self._ino_of.get((v, FILE))
                if ino is not None:
                    forget.append(ino)
        ev = self._waiting.pop(block, None)
        if ev is not None:
            ev.set()
        return forget

    def refresh(self, index: dict, total_size: int) -> tuple[list[int], list[tuple[int, bytes]]]:
        """Serve ``index`` from now on; returns (inodes, (parent inode, name) entries) to invalidate."""
        old, self.tree = self.tree, index
        self.total_size = total_size
        inodes, entries = [], []
        for vpath in old.keys() | index.keys():
            o, n = old.get(vpath), index.get(vpath)
            if o == n:
                continue
            if o is not None:
                ino = self._ino_of.get((vpath, kind_of(o)))
                if ino is not None:
                    inodes.append(ino)
                if vpath != "/" and (n is None or kind_of(n) != kind_of(o)):
                    parent, name = parent_path(vpath)
                    pnode = old.get(parent)
                    pino = self._ino_of.get((parent, DIR)) if pnode is not None else None
                    if pino is not None:
                        entries.append((pino, os.fsencode(name)))
        return inodes, entries

    def close(self) -> None:
        for mm in self.blocks.values():
            mm.close()
        self.blocks.clear()


def _invalidate(inodes: list[int], entries: list[tuple[int, bytes]]) -> None:
    import pyfuse3

    for parent, name in entries:
        try:
            pyfuse3.invalidate_entry(parent, name)
        except OSError:
            pass  # the kernel never looked it up
    for ino in inodes:
        try:
            pyfuse3.invalidate_inode(ino, attr_only=False)
        except OSError:
            pass


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m monarch_rdmafs.blockfs", description="serve a block mount")
    p.add_argument("--fd", type=int, required=True, help="the control socket (inherited)")
    args = p.parse_args(argv)
    logging.basicConfig(level=os.environ.get("MONARCH_LOG", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sock = socket.socket(fileno=args.fd)
    first = recv_frame(sock)
    if first is None:
        return  # the owner gave up before telling what to mount
    start, _ = first
    mountpoint = start["mountpoint"]

    import pyfuse3
    import trio

    from monarch_rdmafs.mount import stop_on_signals, unmount

    def say(obj: Any) -> None:
        head, body = frame(obj)
        sock.sendall(head + body)

    send_lock = trio.Lock()
    tsock = None

    async def send(obj: Any) -> None:
        head, body = frame(obj)
        async with send_lock:
            data = memoryview(head + body)
            while data:
                n = await tsock.send(data)
                data = data[n:]

    class BlockOperations(BlockFS, pyfuse3.Operations):
        pass

    fs = BlockOperations(start["index"], int(start["total"]), send)
    options = set(pyfuse3.default_options) | {f"fsname={start.get('fsname', 'monarch-remotemount')}",
                                              f"subtype={SUBTYPE}", "ro"}

    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        pyfuse3.init(fs, mountpoint, options)
    except Exception as e:
        say({"op": "error", "message": f"{type(e).__name__}: {e}"})
        raise SystemExit(1)

    async def control(nursery: Any) -> None:
        while True:
            got = await _recv(tsock)
            if got is None:
                break
            msg, fds = got
            op = msg.get("op")
            try:
                if op == "receive":
                    if not fds:
                        raise ValueError("a block came without its memory")
                    forget = fs.receive(int(msg["block"]), fds[0], list(msg.get("stale", ())))
                    if forget:
                        await trio.to_thread.run_sync(_invalidate, forget, [])
                elif op == "refresh":
                    inodes, entries = fs.refresh(msg["index"], int(msg["total"]))
                    await trio.to_thread.run_sync(_invalidate, inodes, entries)
                elif op == "unmount":
                    break
                else:
                    raise ValueError(f"unknown operation {op!r}")
                await send({"op": "ack", "seq": msg.get("seq")})
            except Exception as e:  # told to the owner, which raises it
                await send({"op": "nack", "seq": msg.get("seq"), "message": f"{type(e).__name__}: {e}"})
            finally:
                for fd in fds:  # a block's memory stays mapped; its descriptor is not needed
                    os.close(fd)
        nursery.cancel_scope.cancel()

    async def run() -> None:
        nonlocal tsock
        tsock = trio.socket.from_stdlib_socket(sock)
        async with trio.open_nursery() as nursery:
            await nursery.start(stop_on_signals, nursery.cancel_scope)
            nursery.start_soon(control, nursery)
            await send({"op": "ready"})
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    try:
        trio.run(run)
    except BaseException:
        log.exception("the block mount loop failed; unmounting %s", mountpoint)
        pyfuse3.close(unmount=False)
        unmount(mountpoint)
        raise
    finally:
        fs.close()
    pyfuse3.close(unmount=True)


async def _recv(tsock: Any) -> tuple[Any, list[int]] | None:
    """:func:`recv_frame` on trio's socket."""
    head = b""
    fds: list[int] = []
    while len(head) < HEADER.size:
        data, anc, _flags, _addr = await tsock.recvmsg(HEADER.size - len(head), socket.CMSG_SPACE(8 * 4))
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                usable = len(cdata) - len(cdata) % 4
                fds += list(struct.unpack(f"{usable // 4}i", cdata[:usable]))
        if not data:
            for fd in fds:
                os.close(fd)
            return None
        head += data
    _nfds, length = HEADER.unpack(head)
    body = bytearray()
    while len(body) < length:
        data = await tsock.recv(min(length - len(body), 1 << 20))
        if not data:
            for fd in fds:
                os.close(fd)
            return None
        body += data
    return pickle.loads(body), fds


if __name__ == "__main__":
    main()

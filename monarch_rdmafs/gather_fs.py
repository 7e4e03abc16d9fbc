"""A read-only FUSE view of folders on several hosts, one sub-folder per host (``gather_mount``'s filesystem).

Every lookup, listing and read goes to the host that has the file, through a
:class:`Remote` (the caller's connection to the hosts), from a worker thread so
one slow host does not stall the others.  Names and a folder's attributes are
cached by the kernel for a second; a file's attributes are asked of its host at
each stat and open, and its bytes are not cached across opens, so a file a host
is still writing (a log) or has replaced shows its new size and bytes at once.

What it does not do: writes (EROFS).
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import time
from typing import Protocol

import pyfuse3
import trio

_TIMEOUT_S = 1.0
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class Remote(Protocol):
    """The hosts' folders: ``keys`` are the sub-folder names ('' alone: one host, mounted at the root).

    Each call returns its answer, or an errno (int) the host reported.
    """

    keys: list[str]

    def stat(self, key: str, rel: str) -> tuple | int: ...          # (mode, size, mtime_ns, link target)
    def listdir(self, key: str, rel: str) -> list | int: ...        # [(name, mode, size, mtime_ns)]
    def read(self, key: str, rel: str, offset: int, size: int) -> bytes | int: ...


class GatherFS(pyfuse3.Operations):
    """Serves ``remote``'s hosts as sub-folders of the mount root."""

    def __init__(self, remote: Remote):
        super().__init__()
        self.remote = remote
        self.single = remote.keys == [""]
        self._ino_of: dict[str, int] = {"": pyfuse3.ROOT_INODE}
        self._path_of: dict[int, str] = {pyfuse3.ROOT_INODE: ""}
        self._next_ino = itertools.count(pyfuse3.ROOT_INODE + 1)
        self._handles: dict[int, str] = {}
        self._next_fh = itertools.count(1)
        self._started = time.time_ns()

    def _ino(self, path: str) -> int:
        ino = self._ino_of.get(path)
        if ino is None:
            ino = self._ino_of[path] = next(self._next_ino)
            self._path_of[ino] = path
        return ino

    def _path(self, ino: int) -> str:
        try:
            return self._path_of[ino]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _split(self, path: str) -> tuple[str, str] | None:
        """(host key, path on that host) of a mount path; None for the root of a multi-host mount."""
        if self.single:
            return "", path
        if not path:
            return None
        key, _, rel = path.partition("/")
        if key not in self.remote.keys:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return key, rel

    async def _call(self, fn, *args):
        result = await trio.to_thread.run_sync(fn, *args)
        if isinstance(result, int):
            raise pyfuse3.FUSEError(result)
        return result

    def _attrs(self, ino: int, mode: int, size: int, mtime_ns: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.entry_timeout = _TIMEOUT_S
        # A file's size and time are asked afresh each time: a host appends to or replaces its
        # files (logs) under us, and nothing tells the kernel.  A folder's may be a second old.
        a.attr_timeout = _TIMEOUT_S if stat.S_ISDIR(mode) else 0
        a.st_mode = mode
        a.st_nlink = 2 if stat.S_ISDIR(mode) else 1
        a.st_uid, a.st_gid = os.getuid(), os.getgid()
        a.st_size = size
        a.st_blksize = 1 << 17
        a.st_blocks = (size + 511) // 512
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = mtime_ns
        return a

    async def _stat(self, path: str) -> pyfuse3.EntryAttributes:
        where = self._split(path)
        if where is None:
            return self._attrs(pyfuse3.ROOT_INODE, stat.S_IFDIR | 0o555, 0, self._started)
        mode, size, mtime_ns, _ = await self._call(self.remote.stat, *where)
        return self._attrs(self._ino(path), mode, size, mtime_ns)

    async def getattr(self, inode: int, ctx=None) -> pyfuse3.EntryAttributes:
        return await self._stat(self._path(inode))

    async def lookup(self, parent_inode: int, name: bytes, ctx=None) -> pyfuse3.EntryAttributes:
        parent = self._path(parent_inode)
        n = os.fsdecode(name)
        if n in (".", ".."):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self._stat(f"{parent}/{n}" if parent else n)

    async def readlink(self, inode: int, ctx=None) -> bytes:
        where = self._split(self._path(inode))
        if where is None:
            raise pyfuse3.FUSEError(errno.EINVAL)
        _, _, _, target = await self._call(self.remote.stat, *where)
        if not target:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return os.fsencode(target)

    async def opendir(self, inode: int, ctx=None) -> int:
        fh = next(self._next_fh)
        self._handles[fh] = self._path(inode)
        return fh

    async def readdir(self, fh: int, start_id: int, token) -> None:
        path = self._handles[fh]
        where = self._split(path)
        if where is None:
            rows = [(k, stat.S_IFDIR | 0o555, 0, self._started) for k in self.remote.keys]
        else:
            rows = sorted(await self._call(self.remote.listdir, *where))
        for i in range(start_id, len(rows)):
            name, mode, size, mtime_ns = rows[i]
            child = f"{path}/{name}" if path else name
            if not pyfuse3.readdir_reply(token, os.fsencode(name), self._attrs(self._ino(child), mode, size, mtime_ns), i + 1):
                return

    async def releasedir(self, fh: int) -> None:
        self._handles.pop(fh, None)

    async def open(self, inode: int, flags: int, ctx=None) -> pyfuse3.FileInfo:
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        fh = next(self._next_fh)
        self._handles[fh] = self._path(inode)
        return pyfuse3.FileInfo(fh=fh, keep_cache=False)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        where = self._split(self._handles[fh])
        if where is None:
            raise pyfuse3.FUSEError(errno.EISDIR)
        return bytes(await self._call(self.remote.read, where[0], where[1], off, size))

    async def release(self, fh: int) -> None:
        self._handles.pop(fh, None)

    async def access(self, inode: int, mode: int, ctx=None) -> bool:
        if mode & os.W_OK:
            raise pyfuse3.FUSEError(errno.EROFS)
        return True

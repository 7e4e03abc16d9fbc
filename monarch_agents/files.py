"""Files written so that a reader never sees half of one."""

from __future__ import annotations

import os

from monarch_rdmafs.private import UnsafeFolder, check_private, private_dir, runtime_dir  # noqa: F401  (the one rule; see there)


def write_atomic(path: str, data: bytes, durable: bool = True) -> None:
    """Write ``data`` so a reader sees the old file or the new one, never half (mode 0600).

    A temporary file of its own beside ``path`` (so two writers, threads of one process included,
    never share one), written whole, fsynced, then renamed over ``path`` and the folder fsynced: a
    full disk (ENOSPC) or a crash leaves the old file as it was and no temporary behind.  A failure
    raises ``OSError`` naming ``path``.

    ``durable=False`` skips the fsyncs (a few ms): readers still never see half a file, but a
    crash of the machine may lose it.  For files on a hot path that a reader can do without.
    """
    folder = os.path.dirname(path) or "."
    try:
        os.makedirs(folder, exist_ok=True)
        import tempfile  # here: tempfile imports shutil and random (~4 ms), and most commands write nothing

        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)  # 0600
    except OSError as e:
        raise _naming(e, path) from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _naming(e, path) from None
        raise
    if durable:
        _fsync_dir(folder)


def _fsync_dir(folder: str) -> None:
    """Make a rename in ``folder`` survive a crash (best effort: some file systems refuse)."""
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _naming(e: OSError, path: str) -> OSError:
    """``e`` with ``path`` as its file name (the temporary's name, or none, says nothing to a user)."""
    if e.errno is None:
        return e
    return OSError(e.errno, e.strerror, path)  # of e's subclass again (FileNotFoundError, ...): OSError picks it by errno

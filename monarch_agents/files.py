"""Files written so that a reader never sees half of one."""

from __future__ import annotations

import os

from monarch_rdmafs.private import UnsafeFolder, check_private, private_dir, runtime_dir  # noqa: F401  (the one rule; see there)


def write_atomic(path: str, data: bytes, durable: bool = True) -> None:
    """Write ``data`` so a reader sees the old file or the new one, never half (mode 0600).

    ``durable=False`` skips the fsync (a few ms): readers still never see half a file, but a
    crash of the machine may lose it.  For files on a hot path that a reader can do without.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise

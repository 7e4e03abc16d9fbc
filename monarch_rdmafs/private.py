"""Private folders: the one way monarch makes, or agrees to use, a folder only its user may touch.

On a shared machine (a login node, a Slurm node with other jobs) another user can make a folder
first where monarch will look for one (``/tmp/monarch-<uid>/``, a ``.monarch/`` above the project)
and wait for monarch to put keys or workspace chunks in it.  So every folder monarch keeps its own
files in goes through :func:`private_dir`: a missing one is made 0700 (each missing parent too),
an existing one is used only if it is a real folder (not a link) owned by this user and not
writable by group or others; otherwise :class:`UnsafeFolder` says which folder and how to fix it.
A folder of ours that others can read (made by an older monarch, or under a loose umask) is made
0700 quietly: it holds logs and keys.

It lives in the lowest layer (this package imports nothing of monarch's) so the chunk store, the
agents, the schedulers and the engine all use the same rule; ``monarch_agents.files`` re-exports it.
"""

from __future__ import annotations

import os
import stat


class UnsafeFolder(PermissionError):
    """A folder monarch would keep private files in is not safe to use; ``message`` names it, ``hint`` the fix."""

    def __init__(self, message: str, hint: str = ""):
        self.message = message
        self.hint = hint
        super().__init__(message + (f" ({hint})" if hint else ""))


def check_private(path: str, st: os.stat_result | None = None, *, tighten: bool = True) -> None:
    """Raise :class:`UnsafeFolder` unless ``path`` is a folder (not a link) of this user that no one else may write.

    With ``tighten``, a folder of ours readable by others is made 0700.
    """
    if st is None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise UnsafeFolder(f"{path} does not exist", "it is made by monarch; run the command again") from None
    uid = os.getuid()
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFolder(f"{path} is a symbolic link, not a folder of yours",
                           f"remove it (`rm {path}`) and run the command again")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(f"{path} is not a folder", f"remove it (`rm {path}`) and run the command again")
    if st.st_uid != uid:
        raise UnsafeFolder(f"{path} belongs to another user (uid {st.st_uid}), not to you (uid {uid})",
                           "ask them (or root) to remove it, or use a folder of your own")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        # Ours but writable by others: someone else may already have put files in it, so refuse
        # rather than fix; the user decides.
        raise UnsafeFolder(f"{path} is writable by others (mode {mode:o}): its files cannot be trusted",
                           f"check what is in it, then `chmod 700 {path}`, or remove it")
    if tighten and mode & 0o077:
        try:
            os.chmod(path, 0o700)
        except OSError as e:
            raise UnsafeFolder(f"{path} is readable by others (mode {mode:o}) and cannot be made private: {e.strerror}",
                               f"`chmod 700 {path}`") from None


def private_dir(path: str, top: str | None = None) -> str:
    """``path`` as a private folder: made 0700 (with its missing parents) or checked; returns it absolute.

    Only the folders this call makes, ``path`` itself, and every folder from ``top`` (a parent of
    ``path``) down to it are checked: a parent above that already existed is the user's (their
    project, ``/tmp``) and is left as it is.
    """
    path = os.path.abspath(path)
    top = os.path.abspath(top) if top else path
    if path != top and not path.startswith(top.rstrip(os.sep) + os.sep):
        raise ValueError(f"{top} is not a parent of {path}")
    chain = [path]  # path, then its parents up to top
    while chain[-1] != top:
        chain.append(os.path.dirname(chain[-1]))
    d = os.path.dirname(top)
    missing = []
    while not os.path.lexists(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    for d in [*reversed(missing), *reversed(chain)]:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            if d in chain or d in missing:
                check_private(d)  # there already, or made meanwhile by someone: it must be ours
    return path


def make_dirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, but every folder it makes is 0700 (the parents too, which
    ``makedirs`` makes with the umask's mode); folders already there are left as they are."""
    missing = []
    d = os.path.abspath(path)
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            if not os.path.isdir(d):
                raise


def check_mount_parent(mountpoint: str) -> None:
    """Raise :class:`UnsafeFolder` unless no other user can swap what is at ``mountpoint`` (a FUSE mount
    or a link to the synced tree, which commands then run from): its folder must be this user's or
    root's, and writable by others only if sticky (as ``/tmp``: there nobody may rename our entry)."""
    parent = os.path.dirname(os.path.abspath(mountpoint))
    st = os.stat(parent)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (os.getuid(), 0):
        raise UnsafeFolder(f"{parent} belongs to another user (uid {st.st_uid}): what is mounted in it could be swapped",
                           "mount the workspace in a folder of yours")
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise UnsafeFolder(f"{parent} is writable by others (mode {mode:o}): what is mounted in it could be swapped",
                           "mount the workspace in a folder only you can write")
    try:
        own = os.lstat(mountpoint).st_uid
    except FileNotFoundError:
        return
    if own != os.getuid():
        raise UnsafeFolder(f"{mountpoint} belongs to another user (uid {own})", "mount the workspace elsewhere")


def runtime_dir(make: bool = True) -> str:
    """This user's private folder for sockets and per-host scratch: ``$XDG_RUNTIME_DIR/monarch`` where the
    login made one (a tmpfs only the user can enter), else ``<temp dir>/monarch-<uid>``; made or checked
    (``make=False``: only named, for removing what is there)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg):
        try:
            st = os.stat(xdg)
            if st.st_uid == os.getuid() and stat.S_ISDIR(st.st_mode) and not stat.S_IMODE(st.st_mode) & 0o022:
                path = os.path.join(xdg, "monarch")
                return private_dir(path) if make else path
        except OSError:
            pass  # set but gone (a closed login session): fall back to the temp dir
    import tempfile  # here: every command imports this module, few get this far (tempfile costs ~2 ms)

    path = os.path.join(tempfile.gettempdir(), f"monarch-{os.getuid()}")
    if not make:
        return path
    try:
        return private_dir(path)
    except UnsafeFolder as e:
        # A guessable name in a shared folder: someone may have made it first to catch our files.
        raise UnsafeFolder(e.message, "remove it (or ask root to), or set TMPDIR or XDG_RUNTIME_DIR "
                                      "to a folder only you can write") from None

"""Reloading the modules of a long-lived process whose files changed on disk (Monarch's
``monarch._src.actor.code_sync.auto_reload``): after a workspace sync, a proc that imported
``train.py`` runs the new ``train.py`` without restarting.

``AutoReloader`` remembers, for every module loaded from a file outside the interpreter's own
library (site-packages counts as the user's), the file's size and modification time;
``reload_changes()`` reloads each module whose file differs since and names them.  Modules imported
later are seen through ``SysAuditImportHook``: Python reports an ``import`` audit event, then the
``exec`` of the module's code; the pair names the module and its file.  An audit hook can never be
removed, so one hook per process fans out to the installed callbacks, each removable.
"""

from __future__ import annotations

import importlib
import logging
import site
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Callable

__all__ = ["AutoReloader", "Fingerprint", "SysAuditHookGuard", "SysAuditImportHook"]

log = logging.getLogger(__name__)
AuditHook = Callable[[str, tuple], None]
_hooks: dict[int, AuditHook] = {}
_hooks_lock = threading.Lock()
_next_id = 0
_installed = False


def _fan_out(event: str, args: tuple) -> None:
    if event not in ("import", "exec"):
        return  # the only events we use: keep every other audited call cheap
    for hook in list(_hooks.values()):
        try:
            hook(event, args)
        except Exception:  # noqa: BLE001 - an audit hook that raises would fail the audited import
            log.debug("an import hook failed", exc_info=True)


class SysAuditHookGuard:
    """Removes its callback when closed, left as a context manager, or collected."""

    def __init__(self, key: int) -> None:
        self._key = key

    def close(self) -> None:
        _hooks.pop(self._key, None)

    def __enter__(self) -> "SysAuditHookGuard":
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _add_hook(hook: AuditHook) -> SysAuditHookGuard:
    global _next_id, _installed
    with _hooks_lock:
        if not _installed:
            sys.addaudithook(_fan_out)
            _installed = True
        key, _next_id = _next_id, _next_id + 1
        _hooks[key] = hook
    return SysAuditHookGuard(key)


def _source_of(path: Path) -> Path:
    # a code object names its source file even when it was loaded from a legacy .pyc beside it
    return path.with_suffix(".py") if path.suffix in (".pyc", ".pyo") else path


class SysAuditImportHook:
    """Calls ``callback(name, module)`` for each module whose code Python runs from a file."""

    def __init__(self, callback: Callable[[str, ModuleType], None]) -> None:
        self._callback = callback
        self._pending = threading.local()  # the module name of this thread's last import event

    @classmethod
    def install(cls, callback: Callable[[str, ModuleType], None]) -> SysAuditHookGuard:
        return _add_hook(cls(callback))

    def __call__(self, event: str, args: tuple) -> None:
        if event == "import":
            self._pending.name = args[0]
            return
        name = getattr(self._pending, "name", None)
        if name is None:
            return
        self._pending.name = None  # an exec belongs to the import just before it, or to nothing
        module = sys.modules.get(name)
        filename = getattr(module, "__file__", None)
        code = args[0] if args else None
        co_file = getattr(code, "co_filename", None)
        if module is None or filename is None or co_file is None:
            return  # a builtin or extension module, or an unrelated exec()/eval()
        if _source_of(Path(filename)) != Path(co_file):
            return
        self._callback(name, module)


@dataclass(frozen=True)
class Fingerprint:
    """What says a module's file changed: its modification time and size."""

    mtime: float
    size: int

    @classmethod
    def for_path(cls, path: Path) -> "Fingerprint":
        st = path.stat()
        return cls(mtime=st.st_mtime, size=st.st_size)


def _interpreter_owned(path: Path) -> bool:
    """The standard library and the interpreter's own files (but site-packages is the user's)."""
    if not path.is_relative_to(sys.prefix):
        return False
    return not any(path.is_relative_to(p) for p in site.getsitepackages())


class AutoReloader:
    """Reloads (with ``reload``, ``importlib.reload`` by default) the modules whose files changed."""

    def __init__(self, reload: Callable[[ModuleType], Any] = importlib.reload) -> None:
        self._reload = reload
        self._tracked: dict[str, tuple[Path, Fingerprint]] = {}
        for name, module in list(sys.modules.items()):
            if module is not None:
                self._track(name, module)

    def _track(self, name: str, module: ModuleType) -> None:
        filename = getattr(module, "__file__", None)
        if not isinstance(filename, str):
            return
        path = Path(filename)
        if not path.is_absolute() or _interpreter_owned(path):
            return
        try:
            self._tracked[name] = (path, Fingerprint.for_path(path))
        except OSError:
            return  # a file that is gone already (or never was one: a zip member, say)

    def import_callback(self, name: str, module: ModuleType) -> None:
        """What ``SysAuditImportHook`` calls: track a module imported after this reloader was made."""
        self._track(name, module)

    def reload_changes(self) -> list[str]:
        """Reload every tracked module whose file changed since it was seen; their names, in order."""
        reloaded = []
        for name, (path, seen) in list(self._tracked.items()):
            try:
                now = Fingerprint.for_path(path)
            except OSError:
                continue  # deleted: the loaded module stays as it is
            if now == seen:
                continue
            module = sys.modules.get(name)
            if module is not None:
                self._reload(module)
                reloaded.append(name)
            self._tracked[name] = (path, now)
        return reloaded

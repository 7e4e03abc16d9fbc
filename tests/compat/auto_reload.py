"""Reloading changed modules in a live process (Monarch's ``monarch._src.actor.code_sync.auto_reload``):
a module imported before the reloader was made and one imported after, through the import hook, are
both reloaded when their files change; an unchanged or untracked one is not.  Runs unchanged on
monarch and on torchmonarch 0.7.0."""

import os
import sys
import tempfile
import time
from pathlib import Path

from monarch._src.actor.code_sync.auto_reload import AutoReloader, SysAuditImportHook


def write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2_000_000_000))  # a later mtime, on any clock


sys.dont_write_bytecode = True  # every import reads the source: the change is what is loaded
with tempfile.TemporaryDirectory() as d:
    ws = Path(d)
    sys.path.insert(0, d)
    write(ws / "early_mod.py", "value = 'early 1'\n")
    import early_mod  # noqa: E402

    reloaded_names = []
    reloader = AutoReloader(reload=lambda m: (reloaded_names.append(m.__name__), __import__("importlib").reload(m))[1])
    with SysAuditImportHook.install(reloader.import_callback):
        write(ws / "late_mod.py", "value = 'late 1'\n")
        write(ws / "steady_mod.py", "value = 'steady'\n")
        import late_mod  # noqa: E402
        import steady_mod  # noqa: E402

        eval("1 + 1")  # an exec that is no import: ignored
        print("nothing changed:", reloader.reload_changes())
        write(ws / "early_mod.py", "value = 'early 2'\nextra = True\n")
        write(ws / "late_mod.py", "value = 'late 2'\nextra = True\n")
        print("changed:", sorted(reloader.reload_changes()), "reload called for", sorted(reloaded_names))
        print("values:", early_mod.value, late_mod.value, steady_mod.value)
        print("again, nothing:", reloader.reload_changes())
    write(ws / "after_mod.py", "value = 'after 1'\n")
    import after_mod  # noqa: E402  (imported once the hook is closed: not tracked)

    write(ws / "after_mod.py", "value = 'after 2'\nextra = True\n")
    print("closed hook, untracked:", reloader.reload_changes(), after_mod.value)
    sys.path.remove(d)
print("done")

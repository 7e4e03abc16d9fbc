"""What ``monarch sync`` does once, without Click: shared by the Click command (monarch_cli/commands/sync.py)
and the lean entry point (monarch_cli/lean.py), so both print and exit alike."""

from __future__ import annotations

import os
import sys
from typing import Any


def sync_once(name: str | None, *, source: str | None = None, env_dir: str | None = None,
              unreadable: str | None = None) -> tuple[Any, Any, list]:
    """Push the reservation's workspace now (recording ``source``/``env_dir``/``unreadable`` first when
    given): ``(the ReservationSync, the record, its results)``.  Raises what the caller words."""
    from monarch.errors import UsageError
    from monarch._workbench.reserve import load_live
    from monarch._workbench.workspace import ReservationSync, set_workspace

    record, path = load_live(name)
    if source or env_dir or unreadable:
        current = record.workspace or {}
        set_workspace(record, path, source=source or current.get("source") or os.getcwd(),
                      env_dir=env_dir if env_dir is not None else current.get("env_dir", ""),
                      unreadable=unreadable or current.get("unreadable", "skip"))
    if not record.workspace:
        raise UsageError("this reservation has no workspace to sync",
                         "`monarch sync --workspace .` (or `monarch serve --workspace .`)")
    rs = ReservationSync(record)
    return rs, record, rs.sync()


def sync_main(name: str | None = None, as_json: bool = False) -> int:
    """``monarch sync`` once, printed: its exit code."""
    _, record, results = sync_once(name)
    report(results, len(record.hosts), as_json)
    return 0


def report(results: list, hosts: int, as_json: bool) -> None:
    from monarch._workbench.workspace import describe
    from monarch_cli.output import print_json

    if as_json:
        print_json([{"generation": r.generation, "files": r.files, "bytes": r.bytes, "sent_chunks": r.sent_chunks,
                     "sent_bytes": r.sent_bytes, "seconds": round(r.seconds, 4), "changed": r.changed,
                     "skipped": [{"path": p, "why": w} for p, w in r.skipped], "transport": r.transport,
                     "transport_reason": r.transport_reason,
                     "mounts": [{"host": m.get("host", ""), "mountpoint": m["mountpoint"], "mode": m["mode"]}
                                for m in r.mounts]} for r in results])
    else:
        # Plain text, no markup: written as it is, without importing Rich (~50 ms of every sync).
        sys.stderr.write(describe(results, hosts) + "\n")
        sys.stderr.flush()

"""Shared wording and colours of the dashboard: statuses, sizes, durations, safe text."""

from __future__ import annotations

import re

#: Rich style of each status a node of the mesh can be in.
STATUS_STYLE = {
    "running": "green", "idle": "cyan", "failed": "bold red", "killed": "yellow", "exited": "dim",
    "debugger": "bold magenta", "silent": "dim strike", "succeeded": "green", "stopped": "dim",
    "created": "cyan", "initializing": "cyan", "stopping": "yellow", "client": "dim",
}

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: Longer lines are cut: a rank that prints a megabyte on one line must not stall the screen.
MAX_LINE = 2000


def style_of(status: str) -> str:
    return STATUS_STYLE.get(status.lower(), "")


def safe(line: str, limit: int = MAX_LINE, total: int | None = None) -> str:
    """A line as it may be drawn: carriage returns overwrite as a terminal's do (a progress bar shows its
    last state), other control bytes (escape sequences of binary output) shown as '?', cut at ``limit``.

    ``total``: the whole line's length when only its start was fetched."""
    if "\r" in line:
        line = _overwrite(line)
        total = None  # the overwritten start is what is drawn; its length is what counts
    total = len(line) if total is None else max(total, len(line))
    if total > limit:
        line = line[:limit] + f"… ({total - limit} more chars)"
    return _CONTROL.sub("?", line.replace("\t", "    "))


def _overwrite(line: str) -> str:
    shown = ""
    for part in line.split("\r"):
        shown = part + shown[len(part):]
    return shown


def size(n: int | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def proc_status(p) -> str:
    """What a proc or rank is doing, in one word ('debugger' wins over 'running')."""
    if p.in_debugger and p.status == "running":
        return "debugger"
    return p.status


def proc_status_words(p) -> str:
    st = proc_status(p)
    if st == "failed" and p.exit_code is not None:
        return f"failed (exit {p.exit_code})"
    if st == "killed" and p.signal:
        return f"killed (signal {p.signal})"
    if st == "exited":
        return "exited 0"
    return "in debugger" if st == "debugger" else st

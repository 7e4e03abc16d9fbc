"""Live Python stacks (py-spy through `monarch stack`'s function) of every proc and rank, grouped.

Processes whose stacks are identical share one group; the smallest groups come first,
so the one rank stuck somewhere else is at the top.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from monarch_cli.tui.text import safe


@dataclass
class StackGroup:
    """Processes with the same stack."""

    who: list[str] = field(default_factory=list)
    frames: tuple = ()


def group_stacks(rows: list[dict]) -> tuple[list[StackGroup], list[str]]:
    """(groups, errors) from rows of the stacks table: one frame per row, depth 0 innermost."""
    procs: dict[tuple, dict[tuple, list]] = {}
    errors = []
    for r in rows:
        who = (r["host"], r["pid"], r["kind"], r.get("rank"))
        if r.get("error"):
            errors.append(f"{_who(who)}: {r['error']}")
            continue
        thread = (r.get("thread_id"), r.get("thread_name") or "")
        procs.setdefault(who, {}).setdefault(thread, []).append((r["depth"], r["function"], r["filename"], r["line"]))
    groups: dict[tuple, StackGroup] = {}
    for who, threads in sorted(procs.items(), key=lambda kv: (kv[0][2], kv[0][3] if kv[0][3] is not None else -1, kv[0][0])):
        sig = tuple((name, tuple((f, fn, ln) for _, f, fn, ln in sorted(frames, reverse=True)))
                    for (_, name), frames in sorted(threads.items(), key=lambda kv: kv[0][1]))
        groups.setdefault(sig, StackGroup(frames=sig)).who.append(_who(who))
    return sorted(groups.values(), key=lambda g: len(g.who)), errors


def _who(who: tuple) -> str:
    host, pid, kind, rank = who
    return f"rank {rank} ({host} pid {pid})" if kind == "rank" else f"proc {host}/{pid}"


class StacksView(VerticalScroll):
    """Press `s` for a fresh dump; groups of identical stacks, smallest first."""

    def compose(self):
        yield Static(Text("Press s for a fresh py-spy dump of every proc and rank.", "dim"), id="stacks-body")

    def show_groups(self, groups: list[StackGroup], errors: list[str], missing: list[str]) -> None:
        parts: list[Any] = []
        for g in groups:
            head = Text(f"{len(g.who)} × ", "bold")
            head.append(", ".join(g.who), "bold cyan" if len(g.who) > 1 else "bold yellow")
            parts.append(head)
            for name, frames in g.frames:
                parts.append(Text(f"  thread {name or '?'}", "dim"))
                for fn, filename, line in frames:
                    parts.append(Text(f"    {safe(fn, 120)}  {safe(filename, 200)}:{line}"))
        for e in errors:
            parts.append(Text(f"no stack: {safe(e, 300)}", "yellow"))
        for h in missing:
            parts.append(Text(f"host {h} did not answer", "yellow"))
        if not parts:
            parts.append(Text("no Python process to dump", "dim"))
        self.query_one("#stacks-body", Static).update(Group(*parts))

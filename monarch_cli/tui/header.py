"""The top line: which reservation, its scheduler and job id, time left, and a health summary."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from monarch_cli.tui.source import Snapshot
from monarch_cli.tui.text import duration


class ReservationHeader(Static):
    """One line about the reservation; red when something failed, grey hosts counted apart.

    Health first: on a narrow terminal the least useful parts (the clock, the job id, the counts of
    running procs) are left out before the failures, the debugger and the hosts are.
    """

    def show(self, snap: Snapshot) -> None:
        t = Text()
        t.append(" monarch ", style="bold reverse")
        if snap.banner and not snap.job_id:
            t.append("  no live reservation", style="bold red")
            self.update(t)
            return
        t.append(f"  {snap.name}", style="bold")
        answering = sum(h.answering for h in snap.hosts)
        procs = sum(p.kind == "proc" and p.status == "running" for p in snap.procs)
        ranks = sum(p.kind == "rank" and p.status == "running" for p in snap.procs)
        failed = sum(p.status in ("failed", "killed") for p in snap.procs) + sum(a.status == "Failed" for a in snap.actors)
        left = duration(snap.time_left_s) if snap.time_left_s is not None else "unlimited"
        # (what, style, rank: the first left out is the highest rank), in the order shown
        parts = [
            (f"hosts {answering}/{len(snap.hosts)}", "" if answering == len(snap.hosts) else "bold yellow", 1),
            (f"{failed} failed", "bold red", 0) if failed else None,
            (f"{len(snap.debug)} in debugger", "bold magenta", 0) if snap.debug else None,
            (f"time left {left}", "", 2),
            (f"procs {procs} · ranks running {ranks}", "", 3),
            (f"{snap.scheduler} job {snap.job_id}", "", 4),
            (time.strftime("%H:%M:%S", time.localtime(snap.taken_at)), "dim", 5),
        ]
        shown = [p for p in parts if p is not None]
        width = self.size.width or self.app.size.width
        while shown and len(t.plain) + sum(len(p[0]) + 3 for p in shown) > width and max(p[2] for p in shown) > 0:
            shown.remove(max(shown, key=lambda p: p[2]))
        for what, style, _ in shown:
            t.append(" · ")
            t.append(what, style=style)
        self.update(t)

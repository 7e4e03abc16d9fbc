"""The top line: which reservation, its scheduler and job id, time left, and a health summary."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

from monarch_cli.tui.source import Snapshot
from monarch_cli.tui.text import duration


class ReservationHeader(Static):
    """One line about the reservation; red when something failed, grey hosts counted apart."""

    def show(self, snap: Snapshot) -> None:
        t = Text()
        t.append(" monarch ", style="bold reverse")
        if snap.banner and not snap.job_id:
            t.append("  no live reservation", style="bold red")
            self.update(t)
            return
        t.append(f"  {snap.name}", style="bold")
        t.append(f" · {snap.scheduler} job {snap.job_id}")
        t.append(f" · time left {duration(snap.time_left_s) if snap.time_left_s is not None else 'unlimited'}")
        answering = sum(h.answering for h in snap.hosts)
        t.append(f" · hosts {answering}/{len(snap.hosts)}", style="" if answering == len(snap.hosts) else "bold yellow")
        procs = sum(p.kind == "proc" and p.status == "running" for p in snap.procs)
        ranks = sum(p.kind == "rank" and p.status == "running" for p in snap.procs)
        failed = sum(p.status in ("failed", "killed") for p in snap.procs) + sum(a.status == "Failed" for a in snap.actors)
        t.append(f" · procs {procs} · ranks running {ranks}")
        if failed:
            t.append(f" · {failed} failed", style="bold red")
        if snap.debug:
            t.append(f" · {len(snap.debug)} in debugger", style="bold magenta")
        t.append(f" · {time.strftime('%H:%M:%S', time.localtime(snap.taken_at))}", style="dim")
        self.update(t)

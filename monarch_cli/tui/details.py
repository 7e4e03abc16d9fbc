"""What is known of the node selected in the mesh tree: a host, proc, rank or actor."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from monarch_cli.tui.source import ActorView, HostView, ProcView
from monarch_cli.tui.text import duration, proc_status, proc_status_words, safe, size, style_of


class DetailsPane(Static):
    """Key/value facts of the selected node (refreshed with the tree)."""

    def show(self, data: Any) -> None:
        t = Table.grid(padding=(0, 1))
        t.add_column(style="bold", no_wrap=True)
        t.add_column()
        if isinstance(data, HostView):
            t.title = f"host {data.host}"
            t.add_row("address", data.addr)
            t.add_row("agent", "answering" if data.answering else Text(f"not answering: {data.why_silent}", "bold red"))
            t.add_row("agent pid", str(data.agent_pid))
            t.add_row("uptime", duration(data.uptime_s))
            t.add_row("procs", str(data.procs_alive))
            t.add_row("ranks", str(data.ranks_alive))
            t.add_row("load", f"{data.load_1m:.2f} on {data.cpu_count} CPUs")
            t.add_row("memory", f"{size(data.memory_available_bytes)} free of {size(data.memory_total_bytes)}")
        elif isinstance(data, ProcView):
            st = proc_status(data)
            t.title = f"rank {data.rank}" if data.kind == "rank" else f"proc {data.mesh}/{data.pid}"
            t.add_row("host", data.host)
            t.add_row("pid", str(data.pid))
            t.add_row("status", Text(proc_status_words(data), style_of(st)))
            if data.kind == "rank":
                t.add_row("run", data.run_id or "")
                t.add_row("argv", safe(data.argv.replace("\n", " ⏎ "), 500))
            if data.exit_code is not None:
                t.add_row("exit code", str(data.exit_code))
            if data.signal:
                t.add_row("signal", str(data.signal))
            if data.reason:
                t.add_row("reason", safe(data.reason))
            t.add_row("rss", size(data.rss_bytes))
        elif isinstance(data, ActorView):
            t.title = f"actor {data.name}"
            t.add_row("full name", data.full_name)
            t.add_row("host / pid", f"{data.host} / {data.pid}")
            t.add_row("status", Text(data.status, style_of(data.status)))
            t.add_row("endpoint calls", str(data.calls))
            t.add_row("failed calls", Text(str(data.failed_calls), "bold red" if data.failed_calls else ""))
            if data.reason:
                t.add_row("reason", safe(data.reason))
        else:
            self.update(Text("Select a host, proc, rank or actor (arrows, Enter).", "dim"))
            return
        self.update(t)

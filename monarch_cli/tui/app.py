"""The dashboard app: header, banner, tabs (mesh, runs, logs, SQL, stacks, debug), footer.

A thread polls the reservation (``ReservationSource.poll``) about once a second and hands
each snapshot to the UI thread; the widgets update in place.  A reservation that is gone
shows a banner and polling goes on, so the app recovers when a new one replaces it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Input, Static, TabbedContent, TabPane, Tree

from monarch_cli.tui.confirm import ConfirmScreen
from monarch_cli.tui.debug_view import DebugView
from monarch_cli.tui.details import DetailsPane
from monarch_cli.tui.header import ReservationHeader
from monarch_cli.tui.logs_view import LogsView
from monarch_cli.tui.mesh_tree import MeshTree
from monarch_cli.tui.runs_view import RunsView
from monarch_cli.tui.source import ProcView, ReservationSource, Snapshot
from monarch_cli.tui.sql_console import SqlConsole
from monarch_cli.tui.stacks_view import StacksView, group_stacks

#: Seconds between two polls of the reservation.
REFRESH_S = 1.0
#: The widget that takes the keys when a view is shown.  Focus moves with the tab: Textual blurs a
#: focused widget whose pane gets hidden and hands focus to a visible sibling in that same pane, and
#: that pane's TabPane then makes its own tab active again (Enter on a run came back to Runs).
TAB_FOCUS = {"mesh": "#mesh-tree", "runs": "#runs-table", "logs": "#log-view", "sql": "#sql-input",
             "stacks": "#stacks-view", "debug": "#debug-view"}


class DashboardApp(App):
    """`monarch dashboard`: every host, proc, actor and rank of a reservation, live."""

    CSS_PATH = "dashboard.tcss"
    TITLE = "monarch dashboard"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("1", "tab('mesh')", "Mesh"),
        Binding("2", "tab('runs')", "Runs"),
        Binding("3", "tab('logs')", "Logs"),
        Binding("4", "tab('sql')", "SQL"),
        Binding("5", "tab('stacks')", "Stacks"),
        Binding("6", "tab('debug')", "Debug"),
        Binding("slash", "filter", "Filter"),
        Binding("s", "stacks", "Stacks now"),
        Binding("f", "follow", "Follow", show=False),
        Binding("e", "first_error", "First error", show=False),
        Binding("x", "stop_run", "Stop run"),
        Binding("k", "kill_proc", "Kill proc"),
        Binding("escape", "unfocus", "Back", show=False),
    ]

    def __init__(self, source: ReservationSource, *, refresh_s: float = REFRESH_S):
        super().__init__()
        self.source = source
        self.refresh_s = refresh_s
        self.snapshot: Snapshot | None = None
        #: Snapshots applied so far (tests wait on it).
        self.polls = 0
        self._stop = threading.Event()
        self._logs_run: str | None = None

    def compose(self) -> ComposeResult:
        yield ReservationHeader(id="header")
        yield Static("", id="banner")
        with TabbedContent(initial="mesh", id="tabs"):
            with TabPane("Mesh", id="mesh"):
                with Horizontal():
                    with Vertical(id="tree-pane"):
                        yield Input(placeholder="filter by name, status or host (Enter keeps, Esc clears)", id="tree-filter")
                        yield MeshTree(id="mesh-tree")
                    yield DetailsPane(id="details")
            with TabPane("Runs", id="runs"):
                yield RunsView(id="runs-view")
            with TabPane("Logs", id="logs"):
                yield LogsView(id="logs-view")
            with TabPane("SQL", id="sql"):
                yield SqlConsole(id="sql-console")
            with TabPane("Stacks", id="stacks"):
                yield StacksView(id="stacks-view")
            with TabPane("Debug", id="debug"):
                yield DebugView(id="debug-view")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#details", DetailsPane).show(None)
        self.query_one(MeshTree).focus()
        self.poll_loop()

    def on_unmount(self) -> None:
        self._stop.set()

    # -- polling ------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="poll")
    def poll_loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            snap = self.source.poll()
            logs = None
            if snap.banner is None and self._logs_wanted():
                run_id = self._logs_run or (snap.runs[0].run_id if snap.runs else None)
                try:
                    logs = (run_id, self.source.logs(run_id) if run_id else [])
                except Exception as e:
                    snap.banner = f"logs: {e}"
            try:
                self.call_from_thread(self.apply_snapshot, snap, logs)
            except Exception:  # the app is gone
                return
            self._stop.wait(max(0.05, self.refresh_s - (time.monotonic() - started)))

    def _logs_wanted(self) -> bool:
        try:
            return self.query_one("#tabs", TabbedContent).active == "logs"
        except Exception:
            return False

    def apply_snapshot(self, snap: Snapshot, logs: tuple[str | None, list[dict]] | None) -> None:
        self.snapshot = snap
        self.polls += 1
        self.query_one(ReservationHeader).show(snap)
        banner = self.query_one("#banner", Static)
        banner.update(f"⚠ {snap.banner}" if snap.banner else "")
        banner.set_class(bool(snap.banner), "-visible")
        if snap.banner and not snap.job_id:
            return
        tree = self.query_one(MeshTree)
        tree.show(snap)
        self._show_details()
        self.query_one(RunsView).show(snap)
        self.query_one(DebugView).show(snap.debug)
        if logs is not None:
            view = self.query_one(LogsView)
            view.run_id = logs[0]
            view.show_rows(*logs)

    def _show_details(self) -> None:
        node = self.query_one(MeshTree).cursor_node
        self.query_one(DetailsPane).show(node.data if node is not None else None)

    @on(Tree.NodeHighlighted, "#mesh-tree")
    def _highlighted(self) -> None:
        self._show_details()

    @on(Tree.NodeSelected, "#mesh-tree")
    def _selected(self) -> None:
        self._show_details()

    # -- actions ------------------------------------------------------------------------

    def action_tab(self, tab: str) -> None:
        # Focus first (at once, not after a refresh): the old pane must hold no focus when it hides.
        widget = self.query_one(TAB_FOCUS[tab])
        widget.screen.set_focus(widget)
        self.query_one("#tabs", TabbedContent).active = tab

    def action_filter(self) -> None:
        self.action_tab("mesh")
        self.query_one("#tree-filter", Input).add_class("-visible")
        self.query_one("#tree-filter", Input).focus()

    @on(Input.Changed, "#tree-filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.query_one(MeshTree).set_filter(event.value)

    @on(Input.Submitted, "#tree-filter")
    def _filter_done(self) -> None:
        self.query_one(MeshTree).focus()

    def action_unfocus(self) -> None:
        flt = self.query_one("#tree-filter", Input)
        if flt.has_focus:
            flt.value = ""
            flt.remove_class("-visible")
            self.query_one(MeshTree).focus()
        elif self.query_one("#sql-input", Input).has_focus:  # the view's keys (1-6, q) work again
            self.query_one("#sql-table").focus()

    @on(RunsView.ShowLogs)
    def _show_logs(self, event: RunsView.ShowLogs) -> None:
        self._logs_run = event.run_id
        self.query_one(LogsView).run_id = event.run_id
        self.action_tab("logs")

    def action_follow(self) -> None:
        self.action_tab("logs")
        self.query_one(LogsView).toggle_follow()

    def action_first_error(self) -> None:
        self.action_tab("logs")
        self.query_one(LogsView).jump_to_first_error()

    def action_stacks(self) -> None:
        self.action_tab("stacks")
        self.notify("taking stacks (py-spy)…", timeout=2)
        self.take_stacks()

    @work(thread=True, exclusive=True, group="stacks")
    def take_stacks(self) -> None:
        try:
            result = self.source.stacks()
        except Exception as e:
            self.call_from_thread(self.notify, f"stacks: {e}", severity="error")
            return
        groups, errors = group_stacks(result.table.to_pylist())
        self.call_from_thread(self.query_one(StacksView).show_groups, groups, errors, result.missing_hosts)

    def action_stop_run(self) -> None:
        snap = self.snapshot
        run = None
        if self.query_one("#tabs", TabbedContent).active == "runs":
            run = self.query_one(RunsView).selected
        elif snap is not None:
            run = next((r for r in snap.runs if r.status == "running"), None)
        if run is None or run.status != "running":
            self.notify("no running run to stop (select one in Runs)", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.stop_run(run.run_id)

        self.push_screen(ConfirmScreen(f"Stop run {run.run_id} ({run.num_ranks} ranks: {run.argv[:60]})?"), answered)

    @work(thread=True, group="actions")
    def stop_run(self, run_id: str) -> None:
        try:
            self.source.stop_run(run_id)
        except Exception as e:
            self.call_from_thread(self.notify, f"stop failed: {e}", severity="error")
            return
        self.call_from_thread(self.notify, f"stopping run {run_id}")

    def action_kill_proc(self) -> None:
        node = self.query_one(MeshTree).cursor_node
        proc = node.data if node is not None else None
        if not isinstance(proc, ProcView) or proc.kind != "proc" or proc.status != "running":
            self.notify("select a running proc in the mesh tree first", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.kill_proc(proc.host, proc.pid)

        self.push_screen(ConfirmScreen(f"Kill proc {proc.mesh}/{proc.pid} on {proc.host} (SIGKILL)?"), answered)

    @work(thread=True, group="actions")
    def kill_proc(self, host: str, pid: int) -> None:
        try:
            found = self.source.kill_proc(host, pid)
        except Exception as e:
            self.call_from_thread(self.notify, f"kill failed: {e}", severity="error")
            return
        self.call_from_thread(self.notify, f"killed proc {pid} on {host}" if found else f"proc {pid} was no longer running")


def run_dashboard(name: str | None, *, path: str | None = None) -> None:
    """Run the app in this terminal until the user quits."""
    DashboardApp(ReservationSource(name, path=path)).run()

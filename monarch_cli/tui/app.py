"""The dashboard app: header, banner, tabs (mesh, runs, logs, SQL, stacks, debug), footer.

A thread polls the reservation (``ReservationSource.poll``) about once a second and hands
each snapshot to the UI thread; the widgets update in place.  A reservation that is gone
shows a banner and polling goes on; when a new live reservation replaces it, the app exits
with :data:`REPLACED` and ``monarch dashboard`` starts again on the new one (one process
talks to one job: its keys).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time

from textual import on, work
from textual.app import App, ComposeResult, SuspendNotSupported
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Input, Static, TabbedContent, TabPane, Tree

from monarch_cli.tui.confirm import ConfirmScreen, NoticeScreen
from monarch_cli.tui.debug_view import DebugView
from monarch_cli.tui.details import DetailsPane
from monarch_cli.tui.header import ReservationHeader
from monarch_cli.tui.logs_view import LogsView
from monarch_cli.tui.mesh_tree import MeshTree
from monarch_cli.tui.pdb_pane import PdbPane
from monarch_cli.tui.runs_view import RunsView
from monarch_cli.tui.source import ActorView, HostView, ProcView, ReservationSource, Snapshot
from monarch_cli.tui.sql_console import SqlConsole
from monarch_cli.tui.stacks_view import StacksView, group_stacks

#: Seconds between two polls of the reservation.
REFRESH_S = 1.0
#: The widget that takes the keys when a view is shown.  Focus moves with the tab: Textual blurs a
#: focused widget whose pane gets hidden and hands focus to a visible sibling in that same pane, and
#: that pane's TabPane then makes its own tab active again (Enter on a run came back to Runs).
TAB_FOCUS = {"mesh": "#mesh-tree", "runs": "#runs-table", "logs": "#log-view", "sql": "#sql-input",
             "stacks": "#stacks-view", "debug": "#debug-view"}
#: What :meth:`DashboardApp.run` returns when a new live reservation replaced the one shown.
REPLACED = "replaced"


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
        Binding("o", "open_shell", "Shell on host"),
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
        #: The last `monarch shell` command line the shell action ran or showed.
        self.shell_command = ""

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
                yield PdbPane(id="pdb-pane")
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
        if snap.replaced_by and not self.is_web:
            self.exit(REPLACED)  # `monarch dashboard` starts again, a client of the new job
            return
        if snap.replaced_by:  # each browser tab runs its own app process: a reload starts a new one
            snap.banner = f"{snap.banner}; reload the page to watch it"
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
        pdb = self.query_one(PdbPane)
        widget = pdb.query_one("#pdb-input") if tab == "debug" and pdb.has_class("-open") else self.query_one(TAB_FOCUS[tab])
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

    @on(DebugView.Attach)
    def _attach_debug(self, event: DebugView.Attach) -> None:
        self.query_one(DebugView).add_class("-with-pane")
        self.query_one(PdbPane).attach(event.session_id)

    @on(PdbPane.Closed)
    def _pdb_closed(self) -> None:
        self.query_one(DebugView).remove_class("-with-pane")
        self.query_one(DebugView).focus()

    def action_stop_run(self) -> None:
        snap = self.snapshot
        run = None
        if self.query_one("#tabs", TabbedContent).active == "runs":
            run = self.query_one(RunsView).selected
        elif snap is not None:
            run = next((r for r in snap.runs if r.status == "running"), None)
        if run is None:
            self.notify("no running run to stop (select one in Runs)", severity="warning")
            return
        if run.status != "running":
            self.notify(f"run {run.run_id} has already ended ({run.status}): nothing to stop", severity="warning")
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


    def action_open_shell(self) -> None:
        host = self._selected_host()
        if host is None:
            self.notify("select a host (or a proc on it) in the mesh tree first", severity="warning")
            return
        if not host.answering:
            self.notify(f"no shell on {host.host}: its host agent does not answer ({host.why_silent or 'no answer'})",
                        severity="error")
            return
        argv, env = self.source.shell_command(host.host_rank)
        shown = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), "monarch", *map(shlex.quote, argv[3:])])

        def answered(yes: bool | None) -> None:
            if yes:
                self.open_shell(host.host, argv, env, shown)

        self.push_screen(ConfirmScreen(f"Open a shell on {host.host} (monarch shell --host {host.host_rank})? "
                                       "The dashboard comes back when it exits."), answered)

    def _selected_host(self) -> HostView | None:
        node = self.query_one(MeshTree).cursor_node
        data = node.data if node is not None else None
        if isinstance(data, HostView):
            return data
        if isinstance(data, (ProcView, ActorView)) and self.snapshot is not None:
            return next((h for h in self.snapshot.hosts if h.host == data.host), None)
        return None

    def open_shell(self, host: str, argv: list[str], env: dict[str, str], shown: str) -> None:
        """Run `monarch shell` in this terminal (the app suspended), or say the command where that cannot be."""
        self.shell_command = shown
        try:
            with self.suspend():  # raises under --web and where the driver cannot lend the terminal
                print(f"monarch shell on {host} (exit the shell to return to the dashboard)", flush=True)
                code = subprocess.call(argv, env={**os.environ, **env})
        except SuspendNotSupported:
            self.push_screen(NoticeScreen(f"This dashboard cannot lend its terminal. Open the shell on {host} "
                                          "in a terminal with:", shown))
            return
        except OSError as e:
            self.notify(f"could not start monarch shell: {e}", severity="error")
            return
        if code == 0:
            self.notify(f"the shell on {host} exited")
        else:
            self.notify(f"monarch shell on {host} exited with code {code}", severity="error")


def run_dashboard(name: str | None, *, path: str | None = None) -> str | None:
    """Run the app in this terminal until the user quits; :data:`REPLACED` when a new reservation replaced it."""
    return DashboardApp(ReservationSource(name, path=path)).run()

"""`monarch dashboard` driven with Textual's pilot against a real local reservation of 2 hosts.

One reservation serves the module (one process talks to one job, so every pilot test of a
real reservation is here): a failing run (rank 1 raises) and a long one give the tree, runs,
logs and SQL views something real to show; later tests stop the long run from the dashboard,
hold ranks paused in breakpoint() in the pdb pane, ask for a shell on a host, and the last one
stops the reservation under the app (the banner) and serves a new one in its place.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.cli.conftest import MONARCH, ROOT, monarch
from tests.tui.pilot import shown, until
from tests.tui.tmux import Tmux, needs_tmux

FAIL_RANK1 = ("import os, sys, time\n"
              "r = int(os.environ['NODE_RANK'])\n"
              "print(f'rank {r} starting', flush=True)\n"
              "sys.stdout.write('bin\\x1b[2J\\x00' + 'x' * 5000 + '\\n'); sys.stdout.flush()\n"
              "if r == 1:\n"
              "    time.sleep(0.5)\n"
              "    raise ValueError('bad input 42')\n"
              "time.sleep(60)\n")
LONG = "import time; print('long run up', flush=True); time.sleep(120)"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("dashboard-job")
    monarch("serve", "--hosts", "2", cwd=d, check=True)
    r = monarch("run", "--", sys.executable, "-c", FAIL_RANK1, cwd=d, timeout=60)
    assert r.returncode == 1, r.stderr
    yield d
    monarch("stop", "--force", cwd=d, timeout=60)


def make_app(job, refresh_s: float = 0.3):
    from monarch_cli.tui.app import DashboardApp
    from monarch_cli.tui.source import ReservationSource

    return DashboardApp(ReservationSource(path=os.path.join(job, ".monarch", "job_state.pkl")), refresh_s=refresh_s)


def tree_text(app) -> list[str]:
    from monarch_cli.tui.mesh_tree import MeshTree

    out = []

    def walk(node, depth):
        out.append("  " * depth + str(node.label))
        for c in node.children:
            walk(c, depth + 1)
    walk(app.query_one(MeshTree).root, 0)
    return out


@pytest.mark.asyncio
async def test_tree_header_details_of_a_failed_run(job):
    app = make_app(job)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot and app.snapshot.hosts and app.snapshot.procs, what="a snapshot")
        lines = "\n".join(tree_text(app))
        assert "host0" in lines and "host1" in lines
        # Rank 1 failed with exit code 1 and marks its host; rank 0 was stopped because of it.
        assert "rank 1  pid" in lines and "failed (exit 1)" in lines
        assert "✗" in lines
        header = shown(app.query_one("#header"))
        assert "local job" in header and "hosts 2/2" in header and "failed" in header
        # The details pane follows the cursor.
        from monarch_cli.tui.mesh_tree import MeshTree
        from monarch_cli.tui.source import ProcView

        tree = app.query_one(MeshTree)
        tree.focus()

        async def cursor_to(pred, what):
            for _ in range(20):
                await pilot.press("down")
                node = tree.cursor_node
                if node is not None and pred(node.data):
                    await pilot.pause(0.1)
                    return shown(app.query_one("#details"))
            raise AssertionError(f"no {what} in the tree")

        await pilot.press("home")
        details = await cursor_to(lambda d: isinstance(d, ProcView) and d.rank == 1, "rank 1")
        assert "exit code" in details and "argv" in details and "ValueError" in details
        await pilot.press("home")
        details = await cursor_to(lambda d: getattr(d, "host", None) == "host0" and not isinstance(d, ProcView), "host0")
        assert "address" in details and "answering" in details and "memory" in details
        # The tree filter keeps only what matches.
        await pilot.press("slash")
        for ch in "failed":
            await pilot.press(ch)
        await pilot.pause(0.2)
        filtered = "\n".join(tree_text(app))
        assert "failed (exit 1)" in filtered and "killed" not in filtered


@pytest.mark.asyncio
async def test_runs_logs_filter_and_first_error(job):
    app = make_app(job)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot and app.snapshot.runs, what="runs")
        await pilot.press("2")
        from textual.widgets import DataTable, Log

        runs = app.query_one("#runs-table", DataTable)
        await until(pilot, lambda: runs.row_count >= 1, what="runs rows")
        assert "failed" in str(runs.get_row_at(0)[1])
        ranks = app.query_one("#ranks-table", DataTable)
        assert ranks.row_count == 2
        # Enter opens that run's logs, and the Logs view stays (focus left the hidden Runs pane with it).
        assert runs.has_focus
        await pilot.press("enter")
        log = app.query_one("#log-view", Log)
        await until(pilot, lambda: any("ValueError: bad input 42" in line for line in log.lines), what="log lines")
        polls = app.polls
        await until(pilot, lambda: app.polls >= polls + 2, what="two more polls")
        assert app.query_one("#tabs").active == "logs" and log.has_focus
        text = "\n".join(log.lines)
        assert "host0/0  rank 0 starting" in text and "host1/1  rank 1 starting" in text
        # Binary output and a 5,000-char line arrive tamed: no escape byte, cut with a note.
        assert "\x1b" not in text and "\x00" not in text and "more chars)" in text
        app.query_one("#log-filter").value = "rank:1 stream:stderr"
        await until(pilot, lambda: log.lines and all(line.startswith("host1/1!") for line in log.lines), what="filter")
        app.query_one("#log-view").focus()
        await pilot.press("e")
        assert not app.query_one("#logs-view").follow
        first = next(i for i, line in enumerate(log.lines) if "Traceback" in line)
        assert log.scroll_offset.y <= first


@pytest.mark.asyncio
async def test_sql_console_table_history_and_errors(job):
    app = make_app(job)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("4")
        from textual.widgets import DataTable, Input

        inp = app.query_one("#sql-input", Input)
        inp.focus()
        inp.value = "SELECT host, count(*) AS n FROM run_ranks GROUP BY host ORDER BY host"
        await pilot.press("enter")
        table = app.query_one("#sql-table", DataTable)
        await until(pilot, lambda: table.row_count == 2, what="sql rows")
        assert [str(c.label) for c in table.columns.values()] == ["host", "n"]
        assert table.get_row_at(0) == ["host0", "1"]
        # The line is empty again: what is typed next is a new query, not appended to the old one.
        assert inp.value == ""
        await pilot.press(*"SELECT nope FROM nowhere")
        await pilot.press("enter")
        msg = app.query_one("#sql-message")
        await until(pilot, lambda: "error" in shown(msg), what="sql error")
        assert "Schema error" in shown(msg) or "nowhere" in shown(msg), shown(msg)
        hint = "`monarch query --tables` lists the tables and columns"
        assert shown(msg).count(hint) == 1, shown(msg)  # once, below the error (not also inside it)
        assert table.row_count == 2  # the last good answer stays
        await pilot.press("up")
        assert inp.value == "SELECT nope FROM nowhere"
        await pilot.press("up")
        assert inp.value.startswith("SELECT host, count(*)")


@pytest.mark.asyncio
async def test_stopping_a_finished_run_says_it_has_ended(job):
    app = make_app(job)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.snapshot is not None and app.snapshot.runs, what="the runs")
        await pilot.press("2")
        await pilot.press("x")
        await until(pilot, lambda: any("has already ended (failed): nothing to stop" in str(n.message)
                                       for n in app._notifications), what="the notice")


@pytest.mark.asyncio
async def test_tiny_terminal_and_resize(job):
    app = make_app(job)
    async with app.run_test(size=(20, 6)) as pilot:
        await until(pilot, lambda: app.polls >= 2, what="polls at 20x6")
        for size in ((1, 1), (80, 24), (5, 3)):
            await pilot.resize_terminal(*size)
            await pilot.pause(0.2)
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: app.polls >= 4, what="polls after resizing")
        assert "host0" in "\n".join(tree_text(app))


@pytest.mark.asyncio
async def test_stacks_grouped_and_stop_a_run_with_confirmation(job):
    long_run = subprocess.Popen([*MONARCH, "run", "--", sys.executable, "-c", LONG], cwd=job,
                                env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        app = make_app(job)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.snapshot and app.snapshot.runs and app.snapshot.runs[0].status == "running"
                        and sum(p.status == "running" and p.kind == "rank" for p in app.snapshot.procs) == 2,
                        what="the long run")
            await pilot.press("s")
            body = app.query_one("#stacks-body")
            await until(pilot, lambda: "time.sleep" in shown(body) or "<module>" in shown(body),
                        timeout=30, what="stacks")
            rendered = shown(body)
            # Both ranks sleep on the same line: one group of two.
            assert "2 × " in rendered
            await pilot.press("x")
            await pilot.pause(0.2)
            assert "Stop run" in shown(app.screen.query_one("#confirm-question"))
            await pilot.press("n")  # no: nothing happens
            await pilot.pause(0.5)
            assert long_run.poll() is None
            await pilot.press("x")
            await pilot.pause(0.2)
            await pilot.press("y")
            await until(pilot, lambda: long_run.poll() is not None, timeout=20, what="the run to stop")
    finally:
        if long_run.poll() is None:
            long_run.kill()
        long_run.wait(10)


HOLDER = """
import sys
from monarch.actor import Actor, endpoint
from monarch.job import job_load

class Counter(Actor):
    @endpoint
    def incr(self) -> int:
        return 1

procs = job_load().state().hosts.spawn_procs(per_host={"gpus": 1})
counters = procs.spawn("counters", Counter)
counters.incr.call().get()
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.mark.asyncio
async def test_actors_in_the_tree_and_kill_a_proc_with_confirmation(job):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=job, env={**os.environ, "PYTHONPATH": ROOT},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        app = make_app(job)
        async with app.run_test(size=(120, 40)) as pilot:
            from monarch_cli.tui.mesh_tree import MeshTree
            from monarch_cli.tui.source import ProcView

            await until(pilot, lambda: app.snapshot and len(app.snapshot.actors) == 2, what="two actors")
            lines = "\n".join(tree_text(app))
            assert "1 actors" in lines and "counters[0]" in lines and "idle" in lines
            # The details of an actor: its endpoint calls.
            tree = app.query_one(MeshTree)
            tree.focus()
            await pilot.press("home")
            for _ in range(20):
                await pilot.press("down")
                data = tree.cursor_node.data if tree.cursor_node else None
                if isinstance(data, ProcView) and data.kind == "proc" and data.host == "host1":
                    break
            else:
                raise AssertionError("no proc of host1 in the tree")
            victim = data.pid
            await pilot.press("k")
            await pilot.pause(0.2)
            assert "Kill proc" in shown(app.screen.query_one("#confirm-question"))
            await pilot.press("y")
            await until(pilot, lambda: any(p.pid == victim and p.status in ("failed", "killed")
                                           for p in app.snapshot.procs), what="the proc to die")
            await pilot.pause(0.3)
            label = str(tree._by_key[("proc", "host1", victim)].label)
            assert "killed (signal 9)" in label or "failed" in label, label
    finally:
        holder.stdin.close()
        try:
            holder.wait(20)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait(10)


#: Each rank stops in pdb inside step(); rank r returns (40 + r) * 2 + 1.
PAUSED = textwrap.dedent("""\
    import os
    rank = int(os.environ["NODE_RANK"])
    secret = 40 + rank
    def step(x):
        y = x * 2
        breakpoint()
        return y + 1
    print("result", rank, step(secret), flush=True)
""")


def notices(app) -> str:
    """The notifications shown (Textual keeps them on the app; its toasts are drawn from these)."""
    return "\n".join(n.message for n in app._notifications)


def pdb_log(app) -> str:
    return "\n".join(app.query_one("#pdb-log").lines)


async def select_host(pilot, app, host: str) -> None:
    from monarch_cli.tui.mesh_tree import MeshTree
    from monarch_cli.tui.source import HostView

    tree = app.query_one(MeshTree)
    tree.focus()
    await pilot.press("home")
    for _ in range(30):
        node = tree.cursor_node
        if node is not None and isinstance(node.data, HostView) and node.data.host == host:
            return
        await pilot.press("down")
    raise AssertionError(f"no {host} in the tree")


@pytest.mark.asyncio
async def test_pdb_pane_attach_commands_detach_continue_and_an_ended_session(job):
    (job / "paused.py").write_text(PAUSED)
    out, err = open(job / "run.out", "w"), open(job / "run.err", "w")
    run = subprocess.Popen([*MONARCH, "run", "--", sys.executable, "paused.py"], cwd=job, stdout=out, stderr=err,
                           env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"})
    try:
        app = make_app(job)
        async with app.run_test(size=(120, 40)) as pilot:
            from monarch_cli.tui.debug_view import DebugView

            try:
                await until(pilot, lambda: app.snapshot and len(app.snapshot.debug) == 2
                            and all(s.waiting for s in app.snapshot.debug), what="two ranks waiting in pdb")
            except AssertionError:
                raise AssertionError(f"no two ranks in pdb: {app.snapshot}\n{(job / 'run.err').read_text()}") from None
            by_rank = {s.rank: s.id for s in app.snapshot.debug}
            await pilot.press("6")
            table = app.query_one(DebugView)
            assert table.has_focus and table.row_count == 2
            table.move_cursor(row=[int(table.get_row_at(i)[0]) for i in range(2)].index(by_rank[1]))
            await pilot.press("enter")
            status = app.query_one("#pdb-status")
            await until(pilot, lambda: "attached to" in shown(status), what="the attach")
            assert f"session {by_rank[1]}" in shown(status) and "rank 1 on host1" in shown(status)
            line = app.query_one("#pdb-input")
            assert line.has_focus

            async def pdb(command: str, expect: str) -> str:
                before = len(app.query_one("#pdb-log").lines)
                line.value = command
                await pilot.press("enter")
                await until(pilot, lambda: expect in "\n".join(app.query_one("#pdb-log").lines[before:]),
                            what=f"{expect!r} after {command!r}")
                return "\n".join(app.query_one("#pdb-log").lines[before:])

            assert "(Pdb) p secret" in await pdb("p secret", "41")
            trace = await pdb("bt", "step()")
            assert "<module>()" in trace and "-> return y + 1" in trace
            # Ctrl-C stops a command the rank runs, as at a local pdb; the session goes on.
            line.value = "p __import__('time').sleep(60)"
            await pilot.press("enter")
            await pilot.pause(0.5)
            before = len(app.query_one("#pdb-log").lines)
            await pilot.press("ctrl+c")
            await until(pilot, lambda: "KeyboardInterrupt" in "\n".join(app.query_one("#pdb-log").lines[before:]),
                        timeout=20, what="the interrupt")
            # `n` at once: the rank steps on (and, continued later, still ends with 0).
            await pdb("n", "--Return--")
            # The session is held by this dashboard while attached.
            await until(pilot, lambda: any(s.held_by for s in app.snapshot.debug if s.rank == 1), what="held by")
            # Esc detaches: the rank stays paused, held by nobody.
            await pilot.press("escape")
            assert "detached from" in shown(status)
            await until(pilot, lambda: [(s.rank, s.held_by) for s in app.snapshot.debug] == [(0, ""), (1, "")],
                        what="both ranks still paused, free")
            assert run.poll() is None
            # Attach again: the last output comes back, and `c` lets the rank run on.
            await pilot.press("escape")  # closes the pane
            assert table.has_focus
            await pilot.press("enter")
            await until(pilot, lambda: "attached to" in shown(status), what="the second attach")
            assert "<last pdb output follows>" in pdb_log(app)
            line.value = "c"
            await pilot.press("enter")
            await until(pilot, lambda: "ended:" in shown(status), what="the session to end")
            assert "session ended" in pdb_log(app)
            try:
                await until(pilot, lambda: [s.rank for s in app.snapshot.debug] == [0], what="rank 1 gone from the list")
            except AssertionError:
                raise AssertionError(f"{app.snapshot.debug}\n{pdb_log(app)}") from None
            # An attach to the session that ended: one readable line in the pane, the app goes on.
            table.post_message(DebugView.Attach(by_rank[1]))
            await until(pilot, lambda: "cannot attach" in shown(status), what="the error line")
            assert f"session {by_rank[1]} has ended" in shown(status)
            polls = app.polls
            await until(pilot, lambda: app.polls > polls + 1, what="polls after the error")
            await pilot.press("escape")
            # Closed while an attach is under way: the answer is let go, the rank stays paused and free.
            from monarch_cli.tui.pdb_pane import PdbPane

            pane = app.query_one(PdbPane)
            pane.attach(by_rank[0])
            pane.action_leave()
            await pilot.pause(1.0)
            polls = app.polls
            await until(pilot, lambda: app.polls > polls + 1, what="polls after the attach let go")
            assert pane.attachment is None and not pane.has_class("-open")
            assert [(s.rank, s.held_by) for s in app.snapshot.debug] == [(0, "")]
            # Rank 0 through the pane too; the run then ends well.
            table.focus()
            await pilot.pause(0.1)
            table.move_cursor(row=0)
            await pilot.press("enter")
            await until(pilot, lambda: "rank 0 on host0" in shown(status) and "attached" in shown(status),
                        what="the attach to rank 0")
            line.value = "c"
            await pilot.press("enter")
            await until(pilot, lambda: "ended:" in shown(status), what="rank 0's session to end")
        assert run.wait(30) == 0
        printed = (job / "run.out").read_text()
        assert "result 0 81" in printed and "result 1 83" in printed
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            try:
                run.wait(10)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait(10)
        out.close()
        err.close()


@pytest.mark.asyncio
async def test_shell_on_a_host_with_confirmation_names_the_command_where_the_terminal_cannot_be_lent(job, tmp_path):
    app = make_app(job)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.snapshot and len(app.snapshot.hosts) == 2, what="the hosts")
        await pilot.press("o")  # the root is selected: no host yet
        await until(pilot, lambda: "select a host" in notices(app), what="the hint")
        await select_host(pilot, app, "host1")
        await pilot.press("o")
        await pilot.pause(0.2)
        assert "Open a shell on host1 (monarch shell --host 1)" in shown(app.screen.query_one("#confirm-question"))
        await pilot.press("n")
        await pilot.pause(0.2)
        assert app.shell_command == ""
        await pilot.press("o")
        await pilot.pause(0.2)
        await pilot.press("y")
        # The pilot's terminal cannot be lent to a shell (nor can a browser's): the exact command is shown.
        await until(pilot, lambda: app.screen.query("#notice-line"), what="the command")
        command = shown(app.screen.query_one("#notice-line")).strip()
        state = os.path.join(job, ".monarch", "job_state.pkl")
        assert command == f"MONARCH_JOB={shlex.quote(state)} monarch shell --host 1"
        await pilot.press("enter")
        polls = app.polls
        await until(pilot, lambda: app.polls > polls + 1, what="polls after the notice")
        assert app.is_running and app.query_one("#mesh-tree").has_focus
    # That command, run from elsewhere with a command for the shell, lands on host1 of this reservation.
    env_part, rest = command.split(" ", 1)
    argv = [*MONARCH, *shlex.split(rest)[1:], "sh", "-c", "echo shell-on-$MONARCH_HOST_RANK"]
    r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       env={**os.environ, "PYTHONPATH": ROOT, env_part.split("=", 1)[0]: state})
    assert r.returncode == 0 and "shell-on-1" in r.stdout, r.stderr


def web_url(server: subprocess.Popen) -> str:
    """The address `monarch dashboard --web` prints (with its token), from its stderr."""
    for line in server.stderr:
        if line.startswith("monarch dashboard on "):
            return line.split()[3]
    raise AssertionError(f"the dashboard exited ({server.wait()}) without printing its address")


@pytest.mark.asyncio
async def test_web_serves_the_same_app_on_loopback(job):
    import socket

    import aiohttp
    import psutil

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([*MONARCH, "dashboard", "--web", "--port", str(port)], cwd=job,
                              env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    try:
        url = web_url(server)
        assert url.startswith(f"http://127.0.0.1:{port}/?token="), url
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:  # unsafe: keep an IP host's cookie, as a browser does
            page = ""
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    async with http.get(url) as r:
                        page = await r.text()
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.2)
            assert "monarch dashboard" in page and "/ws" in page
            listening = [c.laddr for c in psutil.Process(server.pid).net_connections() if c.status == "LISTEN"]
            assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
            # A browser's websocket starts the app; the screen it draws names the hosts.
            seen = ""
            async with http.ws_connect(f"ws://127.0.0.1:{port}/ws?width=100&height=30") as ws:
                deadline = time.monotonic() + 40
                while time.monotonic() < deadline and not ("host0" in seen and "host1" in seen):
                    try:
                        msg = await ws.receive(timeout=max(0.1, deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        break
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        seen += msg.data.decode("utf-8", "replace")
                    elif msg.type == aiohttp.WSMsgType.TEXT:
                        seen += msg.data
                    else:
                        break
            assert "host0" in seen and "host1" in seen, seen[-2000:]
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


@needs_tmux
def test_in_a_real_terminal_with_tmux(job):
    t = Tmux(job, cols=100, rows=30)
    try:
        t.wait_for(lambda s: "host0" in s and "host1" in s and "hosts 2/2" in s, "the dashboard", timeout=30)
        t.quit()
    finally:
        t.kill()


@pytest.mark.asyncio
async def test_a_silent_agent_gets_no_shell_a_reservation_gone_shows_a_banner_and_a_replaced_one_restarts(job):
    from monarch_cli.tui.app import REPLACED

    app = make_app(job)
    agent = None
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.snapshot and len(app.snapshot.hosts) == 2
                        and all(h.agent_pid for h in app.snapshot.hosts), what="the hosts")
            agent = next(h.agent_pid for h in app.snapshot.hosts if h.host == "host1")
            os.kill(agent, signal.SIGSTOP)  # alive for the scheduler, but it answers nobody
            await until(pilot, lambda: any(h.host == "host1" and not h.answering for h in app.snapshot.hosts),
                        what="host1 greyed")
            await select_host(pilot, app, "host1")
            await pilot.press("o")
            await until(pilot, lambda: "no shell on host1: its host agent does not answer" in notices(app),
                        what="the refusal")
            assert not app.screen.query("#confirm-question")
            os.kill(agent, signal.SIGCONT)
            agent = None
            old = app.snapshot.job_id
            assert monarch("stop", cwd=job, timeout=60).returncode == 0
            banner = app.query_one("#banner")
            await until(pilot, lambda: banner.has_class("-visible"), what="the banner")
            assert "no reservation" in shown(banner) and "monarch serve" in shown(banner)
            assert app.is_running
            monarch("serve", "--hosts", "2", cwd=job, check=True)
            # A new live reservation in its place: the app ends, asking `monarch dashboard` to start again.
            await until(pilot, lambda: app.return_value == REPLACED, what="the app to ask for a restart")
        assert app.snapshot.replaced_by and app.snapshot.replaced_by != old
    finally:
        if agent is not None:
            os.kill(agent, signal.SIGCONT)


@pytest.mark.asyncio
async def test_command_without_terminal_or_reservation(tmp_path):
    r = monarch("dashboard", cwd=tmp_path, timeout=30)
    assert r.returncode != 0 and "terminal" in r.stderr and "Traceback" not in r.stderr
    r = monarch("tui", "--help", cwd=tmp_path, timeout=30)
    assert r.returncode == 0 and "--web" in r.stdout

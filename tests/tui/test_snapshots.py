"""What the dashboard's main views look like, at 80x24 and 120x40 (pytest-textual-snapshot).

The app draws a frozen reservation (tests/tui/frozen_source.py: real telemetry of a
2-host local reservation, saved once, read back through the dashboard's own SQL), so
pids, times, addresses and uptimes are the same on every run and a snapshot changes
only when the drawing does.  Snapshots live in tests/tui/__snapshots__/test_snapshots/.

After a deliberate change of the looks, look at the failure report (snapshot_report.html in
the directory pytest ran from: the old and new screens side by side), then accept the new ones:

    .venv/bin/python -m pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

import time

import pytest

from tests.tui.frozen_source import FrozenReservationSource
from tests.tui.pilot import until

SIZES = [(80, 24), (120, 40)]


@pytest.fixture(autouse=True)
def same_everywhere(monkeypatch):
    # The header prints the snapshot's time in local time: the same everywhere only in one zone.
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.delenv("NO_COLOR", raising=False)  # an App made with it set draws without colours
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def make_app():
    from monarch_cli.tui.app import DashboardApp

    return DashboardApp(FrozenReservationSource(), refresh_s=0.2)


async def first_poll(pilot) -> None:
    from textual.widgets import Input

    await until(pilot, lambda: pilot.app.polls >= 1, "the first snapshot")
    for inp in pilot.app.query(Input):
        inp.cursor_blink = False  # a blinking cursor is there in one screenshot and not in the next


async def freeze(pilot) -> None:
    """Stop the app's polling once the screen shows what the test waited for: nothing moves after."""
    app = pilot.app
    app._stop.set()
    await until(pilot, lambda: all(w.is_finished for w in app.workers if w.group == "poll"), "the poll loop to end")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_mesh_tree_and_details(snap_compare, size):
    async def before(pilot):
        await first_poll(pilot)
        # The cursor on rank 0, paused in pdb: its details (argv, status).
        await pilot.press("down", "down", "down", "down")
        await freeze(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_runs(snap_compare, size):
    async def before(pilot):
        await first_poll(pilot)
        await pilot.press("2")  # the newest run selected: its ranks below (exit codes, durations)
        await freeze(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_runs_an_older_run_selected(snap_compare, size):
    async def before(pilot):
        from textual.widgets import DataTable

        app = pilot.app
        await first_poll(pilot)
        await pilot.press("2", "down")  # the failed run, older than the paused one: its ranks are asked for
        ranks = app.query_one("#ranks-table", DataTable)
        await until(pilot, lambda: ranks.row_count == 2, "the older run's ranks")
        row = [str(c) for c in ranks.get_row_at(1)]
        assert (row[0], row[1], row[3], row[6]) == ("1", "host1", "1", "exited with code 1"), row
        await freeze(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_logs_of_the_failed_run(snap_compare, size):
    # Its ranks printed an escape sequence, NUL and BEL bytes and a 5,000-char line: drawn tamed.
    from monarch_cli.tui.logs_view import LogsView
    from monarch_cli.tui.runs_view import RunsView

    async def before(pilot):
        app = pilot.app
        await first_poll(pilot)
        failed = next(r for r in app.snapshot.runs if r.status == "failed")
        app.post_message(RunsView.ShowLogs(failed.run_id))
        view = app.query_one(LogsView)
        await until(pilot, lambda: any("ValueError: bad input 42" in line for line in view._shown), "the logs")
        await freeze(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_sql_console(snap_compare, size):
    async def before(pilot):
        from textual.widgets import DataTable, Input

        app = pilot.app
        await first_poll(pilot)
        await pilot.press("4")
        app.query_one("#sql-input", Input).value = ("SELECT host, kind, status, count(*) AS n FROM procs "
                                                    "GROUP BY host, kind, status ORDER BY host, kind, status")
        app.query_one("#sql-input", Input).focus()
        await pilot.press("enter")
        table = app.query_one("#sql-table", DataTable)
        # Rows are in at once, but their columns' widths are measured when the table is next idle
        # (Textual's DataTable): a loaded CI once shot the table with its header's widths only.
        await until(pilot, lambda: table.row_count > 0 and not table._require_update_dimensions
                    and not table._updated_cells, "the answer, measured")
        await pilot.pause()
        await freeze(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_sql_console_error_inline(snap_compare, size):
    async def before(pilot):
        from textual.widgets import Input

        app = pilot.app
        await first_poll(pilot)
        await pilot.press("4")
        app.query_one("#sql-input", Input).value = "SELECT nope FROM nowhere"
        app.query_one("#sql-input", Input).focus()
        await pilot.press("enter")
        msg = app.query_one("#sql-message")
        await until(pilot, lambda: "error" in str(msg.content), "the error")
        await freeze(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_stacks_grouped(snap_compare, size):
    async def before(pilot):
        app = pilot.app
        await first_poll(pilot)
        await pilot.press("5")
        app.take_stacks()  # what `s` does, without its passing "taking stacks" toast
        from rich.console import Group

        await until(pilot, lambda: isinstance(app.query_one("#stacks-body").content, Group), "the stacks")
        await freeze(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=before)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_debug_sessions(snap_compare, size):
    async def before(pilot):
        from monarch_cli.tui.debug_view import DebugView

        await first_poll(pilot)
        await pilot.press("6")
        await until(pilot, lambda: pilot.app.query_one(DebugView).row_count == 1, "the session")
        await freeze(pilot)

    assert snap_compare(make_app(), terminal_size=size, run_before=before)


@pytest.fixture(scope="module")
def thousand_procs(tmp_path_factory):
    from tests.tui.frozen_source import FROZEN_DIR, scale_procs

    d = str(tmp_path_factory.mktemp("thousand") / "reservation")
    scale_procs(FROZEN_DIR, d, 4, 1000)
    return d


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_mesh_tree_of_a_thousand_procs_starts_collapsed(snap_compare, size, thousand_procs):
    from monarch_cli.tui.app import DashboardApp

    async def before(pilot):
        await first_poll(pilot)
        await pilot.press("down")  # host0: its counts in the details
        await freeze(pilot)

    app = DashboardApp(FrozenReservationSource(thousand_procs), refresh_s=0.2)
    assert snap_compare(app, terminal_size=size, run_before=before)

"""The mesh tree with 1,000 procs: collapsed by default, refreshed in place, navigable, filterable.

A real reservation of 1,000 proc agents does not fit this 2-core machine (each is a Python
process), so the tables are the recorded real reservation's (tests/tui/frozen_source.py)
scaled to 4 hosts x 250 procs, each with an actor, read through the dashboard's own SQL.
The work a refresh does is counted, not timed: nodes relabelled, added and removed
(``MeshTree.statistics()``), and how many times Textual rebuilt its list of tree lines.
The time it costs is measured in benchmarks/dashboard_bench.py --frozen.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from tests.tui.frozen_source import FROZEN_DIR, FrozenReservationSource, scale_procs
from tests.tui.pilot import shown, until

HOSTS, PROCS = 4, 1000


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("big") / "reservation")
    scale_procs(FROZEN_DIR, d, HOSTS, PROCS)
    return d


def count_line_builds(tree) -> dict:
    """Wrap the tree's line-list builder: how often Textual rebuilt it, and how many lines it made."""
    seen = {"builds": 0, "lines": 0}
    build = tree._build

    def counting() -> None:
        build()
        seen["builds"] += 1
        seen["lines"] += len(tree._tree_lines_cached)

    tree._build = counting
    return seen


@pytest.mark.asyncio
async def test_a_thousand_procs_collapsed_refreshed_in_place_navigable_and_filterable(big):
    from monarch_cli.tui.app import DashboardApp
    from monarch_cli.tui.mesh_tree import MeshTree
    from monarch_cli.tui.source import HostView, ProcView

    source = FrozenReservationSource(big)
    app = DashboardApp(source, refresh_s=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        tree = app.query_one(MeshTree)
        await until(pilot, lambda: app.polls >= 1, "the first snapshot")
        procs = [p for p in app.snapshot.procs if p.kind == "proc"]
        assert len(procs) == PROCS and len(app.snapshot.actors) == PROCS
        # 1,000 procs, 1,000 actors and the ranks are nodes, but only the root and 4 hosts are lines.
        assert tree.statistics().nodes == HOSTS + PROCS + PROCS + 2
        hosts = [n for n in tree.root.children if isinstance(n.data, HostView)]
        assert len(hosts) == HOSTS and not any(h.is_expanded for h in hosts)
        await pilot.pause(0.1)
        assert tree.last_line + 1 == 1 + HOSTS
        assert "250 procs" in str(hosts[0].label)

        # Refreshes of an unchanged mesh touch nothing; one proc failing relabels it and its host.
        seen = count_line_builds(tree)
        polls = app.polls
        await until(pilot, lambda: app.polls >= polls + 3, "three more refreshes")
        assert dataclasses.astuple(tree.statistics())[1:] == (0, 0, 0)
        assert seen["builds"] == 0, seen

        victim = procs[500]
        poll = source.poll

        def one_failed():
            snap = poll()
            for p in snap.procs:
                if (p.host, p.pid) == (victim.host, victim.pid):
                    p.status, p.exit_code, p.rss_bytes = "failed", 1, None
            return snap

        source.poll = one_failed
        polls = app.polls
        await until(pilot, lambda: app.polls >= polls + 2, "refreshes with a failed proc")
        assert tree.statistics().relabelled == 0  # the second refresh: nothing new
        assert seen["builds"] == 0, seen
        host = next(h for h in hosts if h.data.host == victim.host)
        assert "✗ 1 failed" in str(host.label)
        assert "failed (exit 1)" in str(tree._by_key[("proc", victim.host, victim.pid)].label)

        # Navigation: open the first host, walk into it, back to it, and across the hosts.
        tree.focus()
        tree.move_cursor(tree.root)
        await pilot.press("down")
        assert tree.cursor_node is hosts[0]
        await pilot.press("space")
        await pilot.pause(0.1)
        assert len(hosts[0].children) == PROCS // HOSTS + 1  # and rank 0 of the latest run
        assert hosts[0].is_expanded and tree.last_line + 1 == 1 + HOSTS + len(hosts[0].children)
        await pilot.press("down", "down")
        await pilot.pause(0.1)
        second = tree.cursor_node.data
        assert isinstance(second, ProcView) and second.host == "host0" and second.kind == "proc"
        assert re.search(rf"pid\s+{second.pid}\b", shown(app.query_one("#details")))
        await pilot.press("shift+left", "shift+down", "shift+down", "shift+down")
        await pilot.pause(0.1)
        assert tree.cursor_node is hosts[3]
        assert re.search(r"host host3\b", shown(app.query_one("#details")))
        # The filter keeps the one failed proc of 1,000, its host opened to show it.
        await pilot.press("slash")
        await pilot.press(*"failed")
        await until(pilot, lambda: tree.statistics().nodes < 10, "the filter")
        kept = [n.data for n in tree._by_key.values() if isinstance(n.data, ProcView) and n.data.kind == "proc"]
        assert [(p.host, p.pid) for p in kept] == [(victim.host, victim.pid)]
        assert host.is_expanded
        assert tree.last_line + 1 < 10

"""The logs view on a real reservation whose rank prints raw binary, carriage returns and a 1 MiB line.

The host agent records what the rank wrote (invalid UTF-8 replaced, a line that never
ends cut into 64 KiB pieces); the dashboard must draw it without a control byte reaching
the terminal, with every line cut to a screenful and saying how much was cut, and keep
refreshing.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.cli.conftest import monarch
from tests.helpers import stop_client
from tests.tui.pilot import until

MEGABYTE = 1 << 20
BAD_OUTPUT = ("import os\n"
              "os.write(1, b'raw ' + bytes(b for b in range(256) if b != 10) + b' end\\n')\n"
              "os.write(1, b'progress 10%\\rprogress 50%\\rprogress 100%\\n')\n"
              "os.write(2, b'\\x1b]0;title\\x07\\x1b[31mred on stderr\\x1b[0m\\n')\n"
              f"os.write(1, b'y' * {MEGABYTE})\n")  # and exits: a line that never ends
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
CUT = re.compile(r"… \((\d+) more chars\)$")
#: A line of the logs view: who (host/rank), '!' for stderr, the text.
LINE = re.compile(r"^(\S+)([ !]) (.*)$", re.S)


def body(line: str) -> str:
    m = LINE.match(line)
    assert m, line
    return m.group(3)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad-output-job")
    monarch("serve", "--hosts", "1", cwd=d, check=True)
    r = monarch("run", "--", "python3", "-c", BAD_OUTPUT, cwd=d, timeout=60)
    assert r.returncode == 0, r.stderr
    # One runtime per process, bound to one job's keys: drop the one an earlier module's job left.
    stop_client()
    yield d
    stop_client()
    monarch("stop", "--force", cwd=d, timeout=60)


@pytest.mark.asyncio
async def test_binary_and_very_long_lines_are_drawn_tamed(job):
    from textual.widgets import Log

    from monarch_cli.tui.app import DashboardApp
    from monarch_cli.tui.source import ReservationSource
    from monarch_cli.tui.text import MAX_LINE

    app = DashboardApp(ReservationSource(path=os.path.join(job, ".monarch", "job_state.pkl")), refresh_s=0.3)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("3")  # the newest run's logs
        log = app.query_one("#log-view", Log)

        def ys() -> int:
            """Chars of the 1 MiB line the view accounts for: drawn plus said to be cut."""
            total = 0
            for line in log.lines:
                text = body(line)
                if text.startswith("y"):
                    m = CUT.search(text)
                    total += (len(text) - len(m.group(0)) + int(m.group(1))) if m else len(text)
            return total

        await until(pilot, lambda: ys() == MEGABYTE, "the whole megabyte, in pieces")
        # Only what is drawn travels from the agents: no row of the megabyte is fetched whole.
        rows = app.source.logs(None)
        assert rows and max(len(r["line"] or "") for r in rows) <= MAX_LINE + 1
        lines = list(log.lines)
        assert not [line for line in lines if CONTROL.search(line)], "a control byte reached the screen"
        # Its \r (byte 13) overwrote "raw " as a terminal would; what follows it is drawn.
        raw = next(line for line in lines if line.endswith(" end"))
        assert "\ufffd" in raw  # bytes 128-255 are no UTF-8: replaced
        assert any(line.endswith(" progress 100%") for line in lines)  # \r overwrites, as in a terminal
        assert not any("progress 10%" in line for line in lines)
        assert any(line.startswith("host0/0!") and "red on stderr" in line for line in lines)
        pieces = [line for line in lines if body(line).startswith("y")]
        assert len(pieces) > 1 and all(CUT.search(p) for p in pieces)
        assert max(len(line) for line in lines) <= len("host0/0  ") + MAX_LINE + len("… (1048576 more chars)")
        # Still refreshing, and the other views still draw.
        polls = app.polls
        await until(pilot, lambda: app.polls >= polls + 2, "two more refreshes")
        await pilot.press("1")
        await pilot.pause(0.2)
        assert app.query_one("#tabs").active == "mesh"

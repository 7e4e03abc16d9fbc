"""What the dashboard's pilot tests share: waiting for a condition, and reading what a widget shows."""

from __future__ import annotations

import time


async def until(pilot, cond, what: str = "condition", timeout: float = 60.0) -> None:
    """Let the app run until ``cond()`` holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if cond():
            return
    raise AssertionError(f"timed out waiting for {what}")


def shown(widget) -> str:
    """The text a Static shows (Text, Table or Group), as plain text."""
    import io

    from rich.console import Console

    c = Console(width=200, file=io.StringIO(), record=True)
    c.print(widget.content)
    return c.export_text()

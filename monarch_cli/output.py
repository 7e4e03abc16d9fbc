"""Printing: data to stdout (a table or --json), talk and progress to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any



class _LazyConsole:
    """A Rich console made on first use: importing Rich costs tens of ms that
    ``monarch run`` piped into a file never needs."""

    def __init__(self, **kwargs: Any):
        self._kwargs = kwargs
        self._console: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return getattr(self._console, name)


# soft_wrap: a long error line stays one line (Rich would wrap it at 80 columns when piped).
out = _LazyConsole(highlight=False, soft_wrap=True)
err = _LazyConsole(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def escape(text: str) -> str:
    """``text`` with Rich markup characters escaped (Rich is imported only when there is text to print)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)

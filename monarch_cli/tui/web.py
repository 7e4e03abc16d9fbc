"""Entry point of one browser session of `monarch dashboard --web`: the app on a given state file."""

from __future__ import annotations

import sys


def main() -> None:
    from monarch_cli.tui.app import run_dashboard

    run_dashboard(None, path=sys.argv[1])


if __name__ == "__main__":
    main()

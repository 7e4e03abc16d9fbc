"""``monarch guide``: the agent guide shipped with the package (markdown)."""

from __future__ import annotations

import click

from monarch_cli.help import QUICK_START  # noqa: F401  (the quick start lives beside the help it ends)



def guide_text() -> str:
    """The full agent guide (markdown)."""
    from importlib.resources import files

    return files("monarch_cli").joinpath("AGENT_GUIDE.md").read_text()


@click.command("guide")
def guide() -> None:
    """Print the guide for coding agents (markdown): reserve, iterate, logs, query, debug, release."""
    click.echo(guide_text(), nl=False)

"""``monarch guide``: the agent guide shipped with the package (markdown)."""

from __future__ import annotations

import click

#: What `monarch --help` ends with: the shortest path an agent needs (the guide has the rest).
QUICK_START = """\b
Quick start for agents (`monarch guide` prints the full guide):
  monarch apply myjob.job          # reserve myjob.py's job = ProcessJob({"hosts": 2})
  monarch exec -- python train.py  # rank 0; --all, --point hosts=1, --mesh NAME
  monarch run -- python train.py   # every host, torchrun's environment (torchrun ... works too)
  monarch logs                     # the last run's output again
  monarch query 'SHOW TABLES'      # telemetry as SQL
  monarch debug list               # ranks waiting in pdb; `monarch debug` attaches
  monarch kill                     # release"""


def guide_text() -> str:
    """The full agent guide (markdown)."""
    from importlib.resources import files

    return files("monarch_cli").joinpath("AGENT_GUIDE.md").read_text()


@click.command("guide")
def guide() -> None:
    """Print the guide for coding agents (markdown): reserve, iterate, logs, query, debug, release."""
    click.echo(guide_text(), nl=False)

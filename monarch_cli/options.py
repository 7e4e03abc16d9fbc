"""The global flags, one object per command line (``ctx.obj``), set wherever they were given."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Options:
    """--verbose and --json, before or after the subcommand."""

    verbose: bool = False
    json: bool = False

"""``monarch run`` without Click: the everyday command line, parsed by hand.

Importing Click, building its command and the rest of the app costs about 20 ms of every
``monarch run``, more than the run itself on a warm reservation.  A command line made only of
what a run takes every day (``-n/--name``, ``--hosts``, ``-e/--env``, ``-w/--workdir``, then the
command, after ``--`` or not) is run here by the same :func:`~monarch_cli.commands.run_core.run_main`
the Click command calls, and its errors go through the same handler.  Anything else (help, a
flag such as ``--json`` or ``--detach``, an option spelled another way, a typo) returns None and
goes to the Click app, so help and usage errors stay Click's, word for word.
"""

from __future__ import annotations

import os

#: The value options the lean path parses, by spelling -> parameter.
_VALUE_OPTIONS = {"--name": "name", "-n": "name", "--hosts": "hosts", "--env": "env", "-e": "env",
                  "--workdir": "workdir", "-w": "workdir"}


class LeanRun:
    """A ``monarch run`` command line the lean path takes (a plain class: the warm runner's client
    imports this module, and dataclasses costs ~7 ms to import)."""

    __slots__ = ("command", "name", "hosts", "env", "workdir")

    def __init__(self, command: list[str]):
        self.command = command
        self.name: str | None = None
        self.hosts: str | None = None
        self.env: list[str] = []
        self.workdir: str | None = None


def parse_run(argv: list[str]) -> LeanRun | None:
    """``argv`` (what follows ``monarch``) as a lean run, or None when Click should parse it."""
    if not argv or argv[0] != "run":
        return None
    # Click reads --warn-before from it (and words a bad value its own way).
    if "MONARCH_WARN_BEFORE" in os.environ:
        return None
    run = LeanRun(command=[])
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break  # the command's first word: the rest is the command (Click stops parsing there too)
        opt, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
        param = _VALUE_OPTIONS.get(opt)
        if param is None:
            return None  # a flag, help, or an unknown option: Click's to parse (and to word)
        if not eq:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        if not value or value.startswith("-"):
            return None  # odd values (empty, or an option's look): as Click takes them
        if param == "env":
            run.env.append(value)
        elif getattr(run, param) is not None:
            return None  # given twice: Click's rule (the last one wins) is Click's to apply
        else:
            setattr(run, param, value)
        i += 1
    run.command = argv[i:]
    if not run.command:
        return None  # "nothing to run" is the Click command's to say
    return run


def lean_run(argv: list[str]) -> int | None:
    """Run ``argv`` when it is a lean ``monarch run`` command line: its exit code; None otherwise."""
    run = parse_run(argv)
    if run is None:
        return None
    try:
        from monarch_cli.commands.run_core import run_main

        return run_main(run.command, name=run.name, hosts=run.hosts, env=run.env, workdir=run.workdir)
    except (Exception, KeyboardInterrupt) as e:
        from monarch_cli.errors import report

        return report(e)

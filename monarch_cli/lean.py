"""``monarch run``, ``sync`` and ``query`` without Click: the everyday command lines, parsed by hand.

Importing Click, building its command and the rest of the app costs about 20 ms of every
``monarch run``, more than the run itself on a warm reservation.  A command line made only of
what a run takes every day (``-n/--name``, ``--hosts``, ``-e/--env``, ``-w/--workdir``, then the
command, after ``--`` or not) is run here by the same :func:`~monarch_cli.commands.run_core.run_main`
the Click command calls, and its errors go through the same handler.  Anything else (help, a
flag such as ``--json`` or ``--detach``, an option spelled another way, a typo) returns None and
goes to the Click app, so help and usage errors stay Click's, word for word.

``monarch sync`` (``-n/--name``, ``--json``) and ``monarch query SQL`` (``-n/--name``,
``--format``, ``--limit``, ``--no-limit``, ``--strict``, ``--json``) are taken the same way, and
run by the same functions their Click commands call (``monarch_cli.commands.sync_core``,
``query_core``): an edit's sync or a query is a few tens of ms of work, less than the imports
Click and the app would add.
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


class LeanSync:
    """A ``monarch sync`` command line the lean path takes: one push now, no options but these."""

    __slots__ = ("name", "json")

    def __init__(self) -> None:
        self.name: str | None = None
        self.json = False


class LeanQuery:
    """A ``monarch query SQL`` command line the lean path takes."""

    __slots__ = ("sql", "name", "fmt", "limit", "no_limit", "strict", "json")

    def __init__(self) -> None:
        self.sql: str | None = None
        self.name: str | None = None
        self.fmt: str | None = None
        self.limit: int | None = None
        self.no_limit = False
        self.strict = False
        self.json = False


#: The query's --format values (Click words any other).
_FORMATS = ("table", "csv", "json", "jsonl")


def _options(argv: list[str], values: dict[str, str], flags: dict[str, str], positional: bool):
    """``argv`` as ``({param: value}, [positional words])``, or None where Click should parse it:
    an option not in ``values``/``flags``, one given twice, an odd value, ``--``, a word that looks
    like an option."""
    got: dict = {}  # values: str, or True for a flag (no typing import: the warm client loads this)
    words: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("-"):
            if not positional:
                return None
            words.append(a)
            continue
        opt, eq, value = a.partition("=") if a.startswith("--") else (a, "", "")
        value_of: object = True
        if opt in flags and not eq:
            param = flags[opt]
        elif opt in values:
            param = values[opt]
            if not eq:
                if i >= len(argv):
                    return None
                value, i = argv[i], i + 1
            if not value or value.startswith("-"):
                return None  # odd values (empty, or an option's look): as Click takes them
            value_of = value
        else:
            return None  # help, '--', '-', a flag of the app's, or an unknown option: Click's to parse and word
        if param in got:
            return None  # given twice: Click's rule (the last one wins) is Click's to apply
        got[param] = value_of
    return got, words


def parse_sync(argv: list[str]) -> LeanSync | None:
    """``argv`` as a lean ``monarch sync`` (one push of the recorded workspace), or None."""
    if not argv or argv[0] != "sync":
        return None
    parsed = _options(argv[1:], {"--name": "name", "-n": "name"}, {"--json": "json"}, positional=False)
    if parsed is None:
        return None
    got, _ = parsed
    sync = LeanSync()
    sync.name = got.get("name")
    sync.json = bool(got.get("json"))
    return sync


def parse_query(argv: list[str]) -> LeanQuery | None:
    """``argv`` as a lean ``monarch query SQL``, or None (stdin or a file, --tables, --from, --timeout...)."""
    if not argv or argv[0] != "query":
        return None
    # Click reads --timeout from it (and words a bad value its own way).
    if "MONARCH_QUERY_TIMEOUT" in os.environ:
        return None
    parsed = _options(argv[1:], {"--name": "name", "-n": "name", "--format": "fmt", "--limit": "limit"},
                      {"--no-limit": "no_limit", "--strict": "strict", "--json": "json"}, positional=True)
    if parsed is None:
        return None
    got, words = parsed
    if len(words) != 1 or not words[0].strip():
        return None  # no SQL, two, or an empty one: the Click command's to say
    q = LeanQuery()
    q.sql = words[0]
    q.name = got.get("name")
    q.fmt = got.get("fmt")
    if q.fmt is not None and q.fmt not in _FORMATS:
        return None
    limit = got.get("limit")
    if limit is not None:
        if not (isinstance(limit, str) and limit.isdigit() and limit.isascii()) or int(limit) < 1:
            return None
        q.limit = int(limit)
    q.no_limit = bool(got.get("no_limit"))
    q.strict = bool(got.get("strict"))
    q.json = bool(got.get("json"))
    return q


def parse(argv: list[str]) -> LeanRun | LeanSync | LeanQuery | None:
    """``argv`` as a command line the lean path takes, or None (the Click app's)."""
    if not argv:
        return None
    if argv[0] == "run":
        return parse_run(argv)
    if argv[0] == "sync":
        return parse_sync(argv)
    if argv[0] == "query":
        return parse_query(argv)
    return None


def lean_command(argv: list[str]) -> int | None:
    """Run ``argv`` when it is a lean command line (run, sync, query): its exit code; None otherwise."""
    if argv and argv[0] == "run":
        return lean_run(argv)
    cmd = parse(argv)
    if cmd is None:
        return None
    as_json = bool(getattr(cmd, "json", False))
    try:
        if isinstance(cmd, LeanSync):
            from monarch_cli.commands.sync_core import sync_main

            return sync_main(cmd.name, as_json=cmd.json)
        from monarch_cli.commands.query_core import DEFAULT_LIMIT, query_main

        if not isinstance(cmd, LeanQuery):
            return None
        q = cmd
        fmt = q.fmt or ("json" if q.json else "table")
        row_limit = None if q.no_limit else (q.limit or DEFAULT_LIMIT)
        return query_main(q.sql or "", name=q.name, fmt=fmt, row_limit=row_limit, strict=q.strict)
    except (Exception, KeyboardInterrupt) as e:
        from monarch_cli.errors import report

        return report(e, as_json=as_json)


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

"""``monarch query``: SQL over the telemetry of every host (DataFusion), or of a saved job."""

from __future__ import annotations

import sys

import click

from monarch_cli.commands._common import Duration, handled, name_option, opts
from monarch_cli.commands.query_core import DEFAULT_LIMIT, print_result, query_main
from monarch_cli.output import escape, out, print_json

__all__ = ["query", "print_result", "DEFAULT_LIMIT"]


@click.command("query")
@click.argument("sql", required=False)
@name_option
@click.option("--file", "-f", "sql_file", metavar="FILE", help="Read the SQL from FILE (instead of the argument; '-' as SQL reads stdin).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "jsonl"]), default=None,
              help="Output format (default: a table; --json is the same as --format json; jsonl: one row per line).")
@click.option("--limit", type=click.IntRange(min=1), default=DEFAULT_LIMIT, show_default=True,
              help="Return at most this many rows.")
@click.option("--no-limit", is_flag=True, help="Return every row (a query can match millions).")
@click.option("--timeout", type=Duration(), default="10s", show_default=True, envvar="MONARCH_QUERY_TIMEOUT",
              help="How long hosts get to answer (30s, 2m; plain numbers are seconds); a slower query is cancelled.")
@click.option("--strict", is_flag=True, help="Fail (exit 5) if a host does not answer, instead of answering without it.")
@click.option("--from", "from_dir", metavar="DIR", help="Query telemetry saved by `monarch stop --save DIR` instead.")
@click.option("--tables", "list_tables", is_flag=True, help="List every table and column, with what they mean.")
@click.option("--json", "json_here", is_flag=True, help="Print JSON on stdout (as `monarch --json query`).")
@click.pass_context
def query(ctx: click.Context, json_here: bool, sql: str | None, name: str | None, sql_file: str | None, fmt: str | None, limit: int, no_limit: bool,
          timeout: float, strict: bool, from_dir: str | None, list_tables: bool) -> None:
    """Run SQL over the telemetry of every host: actors, messages, logs, runs, procs, stacks ...

    `monarch query "SELECT host, count(*) FROM procs WHERE status = 'failed' GROUP BY host"`;
    `monarch query "SHOW TABLES"`, `monarch query "DESCRIBE logs"`, `monarch query --tables` for what each column means.
    SQL may also come from stdin (`-`) or a file (-f FILE), as in PyTorch Monarch.
    """
    from monarch.errors import UsageError

    o = opts(ctx)
    json_out = o.json or json_here
    fmt = fmt or ("json" if json_out else "table")
    with handled(ctx):
        if list_tables:
            _print_tables(fmt)
            return
        sql = _read_sql(sql, sql_file)
        if not sql:
            raise UsageError("no SQL given", 'e.g. `monarch query "SELECT * FROM runs"`; `monarch query --tables` lists the tables')
        row_limit = None if no_limit else limit
        query_main(sql, name=name, fmt=fmt, row_limit=row_limit, timeout=timeout, strict=strict, from_dir=from_dir)


def _read_sql(sql: str | None, sql_file: str | None) -> str | None:
    """The SQL: the argument, stdin for '-', or -f FILE (never two of them)."""
    from monarch.errors import UsageError

    if sql is not None and sql_file is not None:
        raise UsageError("pass SQL or --file, not both")
    if sql_file is not None:
        try:
            with open(sql_file) as f:
                sql = f.read()
        except OSError as e:
            raise UsageError(f"cannot read --file {sql_file}: {e.strerror}") from None
    elif sql == "-":
        sql = sys.stdin.read()
    if sql is not None and not sql.strip():
        raise UsageError("SQL query is empty")
    return sql


def _print_tables(fmt: str) -> None:
    from monarch_telemetry.schema import all_specs

    specs = all_specs()
    if fmt == "json":
        print_json([{"table": s.name, "kind": s.kind, "doc": s.doc,
                     "columns": [{"name": c.name, "type": c.type, "nullable": c.nullable, "doc": c.doc} for c in s.columns]}
                    for s in specs])
        return
    for s in specs:
        out.print(f"[bold]{s.name}[/] [dim]({s.kind})[/] — {escape(s.doc)}")
        width = max(len(c.name) for c in s.columns)
        for c in s.columns:
            out.print(f"  {c.name:<{width}}  [cyan]{c.type:<9}[/] {escape(c.doc)}{' [dim](nullable)[/]' if c.nullable else ''}")
        out.print("")

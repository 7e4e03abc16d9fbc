"""What ``monarch query`` does, without Click: shared by the Click command (monarch_cli/commands/query.py)
and the lean entry point (monarch_cli/lean.py), so both print and exit alike."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from monarch_cli.output import err, escape, out, plain_table, print_json, rich_would_style

if TYPE_CHECKING:
    import pyarrow as pa

#: Rows shown unless --limit/--no-limit say otherwise.
DEFAULT_LIMIT = 1000
#: How long hosts get to answer unless --timeout (or MONARCH_QUERY_TIMEOUT) says otherwise (seconds).
DEFAULT_TIMEOUT_S = 10.0


def query_main(sql: str, *, name: str | None = None, fmt: str = "table", row_limit: int | None = DEFAULT_LIMIT,
               timeout: float = DEFAULT_TIMEOUT_S, strict: bool = False, from_dir: str | None = None) -> int:
    """Answer ``sql`` (already read and checked non-empty) and print it in ``fmt``; the exit code.
    A bad query or a gone reservation raises (the caller's error handler words it)."""
    if from_dir:
        from monarch._workbench.telemetry import query_saved

        result = query_saved(from_dir, sql, row_limit=row_limit, timeout_s=timeout)
    else:
        from monarch._workbench.reserve import load_for_reading
        from monarch._workbench.telemetry import query_on_agent as run_query
        from monarch._workbench.telemetry import query_stopped

        readable = load_for_reading(name)
        if readable.stopped:
            err.print(f"[yellow]note:[/] {escape(readable.note())}: the run_ranks and logs of its runs "
                      "(the rest went with its agents; `monarch stop --save DIR` keeps it all)")
            result = query_stopped(readable.record, sql, row_limit=row_limit, timeout_s=timeout)
        else:
            result = run_query(readable.record, sql, row_limit=row_limit, timeout_s=timeout, strict=strict)
    for host in result.missing_hosts:
        err.print(f"[yellow]warning:[/] host {escape(host)} did not answer ({escape(result.errors.get(host, ''))}); "
                  "the answer covers the other hosts (--strict makes this an error)")
    if result.limited:
        err.print(f"[yellow]note:[/] showing the first {row_limit} rows; --limit N or --no-limit shows more")
    print_result(result.table, fmt, result.missing_hosts)
    return 0


def print_result(table: "pa.Table", fmt: str, missing_hosts: list[str]) -> None:
    """Print an Arrow table as a Rich table, CSV, JSON ({"rows", "missing_hosts"}) or JSON lines (one row each)."""
    if fmt == "json":
        print_json({"rows": table.to_pylist(), "missing_hosts": missing_hosts})
    elif fmt == "jsonl":
        import json

        for row in table.to_pylist():
            sys.stdout.write(json.dumps(row, default=str) + "\n")
        sys.stdout.flush()
    elif fmt == "csv":
        import csv

        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(table.column_names)
        for row in table.to_pylist():
            w.writerow(["" if v is None else _text(v) for v in row.values()])
        sys.stdout.flush()
    else:
        cells = [["" if v is None else _text(v) for v in row.values()] for row in table.to_pylist()]
        drawn = plain_table(list(table.column_names), cells)
        if drawn is not None:  # what Rich would print, without its layout (~0.2 ms a row)
            sys.stdout.write(drawn)
            sys.stdout.flush()
        else:
            from rich.table import Table

            t = Table(*table.column_names, show_lines=False)
            for row in cells:
                t.add_row(*(escape(c) for c in row))
            out.print(t)
        count = f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}"
        if rich_would_style(2):
            err.print(f"[dim]{count}[/]")
        else:
            sys.stderr.write(count + "\n")
            sys.stderr.flush()


def _text(v: Any) -> str:
    if hasattr(v, "isoformat"):
        return v.isoformat(sep=" ")
    return str(v)

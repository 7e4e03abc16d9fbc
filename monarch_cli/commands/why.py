"""``monarch why``: the root failure of the last run, and what failed because of it."""

from __future__ import annotations

import click

from monarch_cli.commands._common import handled, name_option, opts
from monarch_cli.output import err, escape, out, print_json


@click.command("why")
@name_option
@click.option("--from", "from_dir", metavar="DIR", help="Answer from telemetry saved by `monarch stop --save DIR`.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds hosts get to answer each query.")
@click.option("--json", "json_here", is_flag=True, help="Print JSON on stdout (as `monarch --json why`).")
@click.pass_context
def why(ctx: click.Context, json_here: bool, name: str | None, from_dir: str | None, timeout: float) -> None:
    """Say which rank (or actor) failed first in the last run, its exception and last lines, and what followed."""
    from monarch_telemetry.why import explain

    o = opts(ctx)
    json_out = o.json or json_here
    with handled(ctx):
        missing: set[str] = set()
        if from_dir:
            from monarch._workbench.telemetry import query_saved

            def q(sql: str):
                return query_saved(from_dir, sql, row_limit=None, timeout_s=timeout).table
        else:
            from monarch._workbench.reserve import load_for_reading
            from monarch._workbench.telemetry import query, query_stopped

            readable = load_for_reading(name)
            record = readable.record
            if readable.stopped:
                err.print(f"[yellow]note:[/] {escape(readable.note())} (its runs' exits and output; "
                          "actor failures went with its agents unless saved with `monarch stop --save DIR`)")

                def q(sql: str):
                    return query_stopped(record, sql, row_limit=None, timeout_s=timeout).table
            else:
                def q(sql: str):
                    r = query(record, sql, row_limit=None, timeout_s=timeout)
                    missing.update(r.missing_hosts)
                    return r.table

        answer = explain(q)
        if json_out:
            print_json({**answer.to_dict(), "missing_hosts": sorted(missing)})
            return
        for host in sorted(missing):
            err.print(f"[yellow]warning:[/] host {escape(host)} did not answer; the answer may miss its failures")
        if answer.root is None:
            if answer.run_id is None:
                out.print("no runs and no failed actors recorded on this reservation")
            else:
                out.print(f"the last run [bold]{answer.run_id}[/] ({escape(answer.argv or '')}) "
                          f"{'is running' if answer.status == 'running' else answer.status}: nothing failed")
            return
        if answer.run_id:
            out.print(f"run [bold]{answer.run_id}[/] ({escape(answer.argv or '')}): {answer.status}")
        r = answer.root
        out.print(f"[bold red]root failure:[/] {_describe(r)}")
        if r.exception:
            out.print(f"  exception: [red]{escape(r.exception)}[/]")
            if "Read-only file system" in r.exception:
                from monarch._workbench.run import read_only_hint

                out.print(f"  [dim]hint:[/] {escape(read_only_hint(answer.run_id))}")
        if r.log_tail:
            out.print("  last lines:")
            for line in r.log_tail:
                out.print(f"    {escape(line)}", highlight=False)
        if answer.consequences:
            out.print(f"then ({len(answer.consequences)}):")
            for c in answer.consequences:
                out.print(f"  {_describe(c)}")


def _describe(f) -> str:
    when = f.time.strftime("%H:%M:%S.%f")[:-3] if f.time is not None else "?"
    if f.kind == "actor":
        return f"actor {escape(f.actor or '?')} on {escape(f.host)} failed at {when}: {escape(_one(f.reason))}"
    how = f"killed by signal {f.signal}" if f.signal else f"exited with code {f.exit_code}"
    return f"rank {f.rank} on {escape(f.host)} {how} at {when}" + (f" ({escape(_one(f.reason))})" if f.reason else "")


def _one(text: str | None) -> str:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""

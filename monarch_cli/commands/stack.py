"""``monarch stack``: live Python stacks (py-spy) of every proc and rank, also kept as ``stacks`` rows."""

from __future__ import annotations

import click

from monarch_cli.commands._common import handled, name_option, opts
from monarch_cli.output import err, escape, out, print_json


@click.command("stack")
@name_option
@click.option("--rank", "ranks", type=int, multiple=True, help="Only this rank of the running `monarch run` (repeatable).")
@click.option("--host", "hosts", multiple=True, help="Only this host, by name or rank (repeatable).")
@click.option("--timeout", type=click.FloatRange(min=1), default=30.0, show_default=True, help="Seconds hosts get to answer.")
@click.option("--json", "json_here", is_flag=True, help="Print JSON on stdout (as `monarch --json stack`).")
@click.pass_context
def stack(ctx: click.Context, json_here: bool, name: str | None, ranks: tuple[int, ...], hosts: tuple[str, ...], timeout: float) -> None:
    """Print where every rank and proc is right now (py-spy dump), innermost frame last."""
    from monarch.errors import UsageError
    from monarch._workbench.reserve import load_live
    from monarch._workbench.telemetry import stacks

    o = opts(ctx)
    json_out = o.json or json_here
    with handled(ctx):
        record, _ = load_live(name)
        selected = None
        if hosts:
            by = {h.host: h for h in record.hosts} | {str(h.host_rank): h for h in record.hosts}
            unknown = [h for h in hosts if h not in by]
            if unknown:
                raise UsageError(f"no host {unknown[0]!r} in this reservation",
                                 f"its hosts: {', '.join(h.host for h in sorted(record.hosts, key=lambda h: h.host_rank))}")
            selected = list({by[h].host: by[h] for h in hosts}.values())
        result = stacks(record, hosts=selected, ranks=list(ranks) or None, timeout_s=timeout)
        rows = result.table.to_pylist()
        if json_out:
            print_json({"rows": rows, "missing_hosts": result.missing_hosts})
            return
        for host in result.missing_hosts:
            err.print(f"[yellow]warning:[/] host {escape(host)} did not answer ({escape(result.errors.get(host, ''))})")
        if not rows:
            err.print("no live procs or ranks to take stacks of" + (" (with that --rank/--host)" if ranks or hosts else ""))
            return
        groups: dict[tuple, list[dict]] = {}
        for r in rows:
            groups.setdefault((r["host"], r["pid"], r["thread_id"]), []).append(r)
        for (host, pid, _), frames in groups.items():
            first = frames[0]
            what = f"rank {first['rank']} of {first['run_id']}" if first["kind"] == "rank" else "proc"
            if first["error"]:
                out.print(f"[bold]{escape(host)}[/] pid {pid} ({what}): [red]{escape(first['error'])}[/]")
                continue
            out.print(f"[bold]{escape(host)}[/] pid {pid} ({what}) thread {escape(first['thread_name'] or str(first['thread_id']))}:")
            for f in sorted(frames, key=lambda f: -f["depth"]):
                out.print(f"    {escape(f['filename'])}:{f['line']} in {escape(f['function'])}", highlight=False)

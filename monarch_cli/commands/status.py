"""``monarch status``: the reservation, a live check of every agent, its procs and runs."""

from __future__ import annotations

import time

import click

from monarch_cli.commands._common import name_option, handled, opts
from monarch_cli.output import err, escape, out, print_json

_PING_TIMEOUT_S = 2.0


@click.command("status")
@name_option
@click.pass_context
def status(ctx: click.Context, name: str | None) -> None:
    """Show the reservation and check every host agent (exit 5 if one does not answer)."""
    from monarch.errors import ExitCode
    from monarch._workbench.hosts import ping_agents
    from monarch._workbench.reserve import HostState
    from monarch._workbench.reserve import describe, time_warning_s
    from monarch._workbench.state import StatePaths, load_state
    o = opts(ctx)
    with handled(ctx):
        path = StatePaths().resolve(name)
        record = load_state(path)
        d = describe(record)
        sched_state = d.state.value if d else "GONE"
        hosts = []
        # A failed allocation may still have agents that answer (one local agent died): ask them all.
        for a in ping_agents(record, _PING_TIMEOUT_S) if d and d.state is not HostState.ENDED else []:
            h, info = a.host, a.info
            entry = {"host": h.host, "rank": h.host_rank, "addr": h.addr, "pid": h.pid}
            if info is not None:
                entry.update(agent="up", procs=len(info.procs), runs=[" ".join(r["argv"]) for r in info.runs],
                             uptime_s=round(time.time() - info.started_at, 1))
                ws = info.services.get("workspace") or {}
                if ws.get("mounts"):
                    entry["workspace"] = {"transport": ws.get("transport"), "transport_reason": ws.get("transport_reason"),
                                          "mounts": ws["mounts"]}
            else:
                entry.update(agent=_why_silent(h), error=a.error, procs=0, runs=[])
            hosts.append(entry)
        data = {
            "name": record.name, "job_id": record.job_id, "scheduler": record.spec.scheduler,
            "state": sched_state, "reason": d.reason if d else "the scheduler no longer knows this job",
            "time_left_s": d.time_left_s if d else None, "shape": record.spec.summary(),
            "ready": record.ready, "hosts": hosts,
        }
        if d and d.details:
            data["scheduler_hosts"] = d.details
        bad = [h for h in hosts if h["agent"] != "up"]
        code, message, hint = ExitCode.OK, "", ""
        if not d or d.state is HostState.ENDED or (bad and len(bad) == len(hosts)):
            code, message = ExitCode.STATE, f"the reservation {record.name!r} ({record.job_id}) is gone: {data['reason']}"
            hint = f"`monarch serve{_flag(record.name)}` reserves again (`monarch stop{_flag(record.name)}` cleans up)"
        elif bad:
            code = ExitCode.AGENT
            message = "; ".join(f"host agent on {h['host']} (pid {h['pid']}) {h['agent']}" for h in bad)
            hint = f"`monarch serve --replace{_flag(record.name)}` makes a new reservation"
        if o.json:
            if code:
                data.update(error=message, hint=hint, exit_code=int(code))
            print_json(data)
        else:
            line = f"job [bold]{record.name!r}[/] {record.job_id} ({record.spec.summary()}): {sched_state}"
            if data["reason"]:
                line += f" — {data['reason']}"
            if d and d.time_left_s is not None:
                line += f", {_fmt_left(d.time_left_s)} left"
                if d.time_left_s <= time_warning_s():
                    line += " [yellow](time limit soon)[/]"
            out.print(line)  # data, like the table under it: `monarch status | head` keeps it
            rows = [[(str(h["rank"]), ""), (h["host"], ""), (h["agent"], "green" if h["agent"] == "up" else "red"),
                     (str(h["pid"]), ""), (str(h["procs"]), ""), ("; ".join(h["runs"]) or "-", ""), (h["addr"], "")]
                    for h in hosts]
            if hosts:
                _print_table(("rank", "host", "agent", "pid", "procs", "running", "address"), rows)
            mounted = [(h, mt) for h in hosts for mt in h.get("workspace", {}).get("mounts", [])]
            if mounted:
                rows = []
                for h, mt in mounted:
                    how = mt["mode"] + ("" if mt.get("alive", True) else " (down)")
                    if mt.get("fallback_reason"):
                        how += f" ({mt['fallback_reason']})"
                    rows.append([(str(h["rank"]), ""), (mt["name"], ""),
                                 (f"{mt['mountpoint']} {how}", "" if mt.get("alive", True) else "red"),
                                 (f"{mt['files']:,}", ""), (_fmt_bytes(mt["bytes"]), ""),
                                 (f"{_fmt_ago(time.time() - mt['synced_at'])} ago", ""), (h["workspace"]["transport"], "")])
                _print_table(("rank", "mount", "where", "files", "bytes", "last sync", "transport"), rows)
                reason = next((h["workspace"]["transport_reason"] for h, _ in mounted), "")
                if reason:
                    err.print(f"[dim]transport tcp: {reason}[/]")
            if d and d.details:
                cols = list(d.details[0])
                _print_table(cols, [[(str(row.get(c, "")), "") for c in cols] for row in d.details])
            if code:
                err.print(f"[bold red]error:[/] {escape(message)}")
                err.print(f"  [dim]hint:[/] {escape(hint)}")
        raise click.exceptions.Exit(int(code))


#: Up to this many rows a terminal gets a Rich table (borders, cells wrapped to its width); past
#: it, and always when piped, plain columns: Rich took ~1.5 ms a row (256 hosts with a workspace:
#: 0.75 s of a `monarch status`, 1.3-2.4 s on a loaded machine), plain columns ~5 us.
_RICH_ROWS = 40


def _print_table(headers, rows: list[list[tuple[str, str]]]) -> None:
    """A table of ``rows`` (cells: (text, Rich style or "")) on stdout."""
    if out.is_terminal and len(rows) <= _RICH_ROWS:
        from rich.table import Table

        t = Table(*headers)
        for row in rows:
            t.add_row(*(f"[{st}]{escape(text)}[/]" if st else escape(text) for text, st in row))
        out.print(t)
        return
    # Plain columns, nothing cut (a pipe has no width to fit; a terminal wraps a long line).
    widths = [max([len(h), *(len(r[i][0]) for r in rows)]) for i, h in enumerate(headers)]
    color = out.is_terminal and not out.no_color

    def line(cells) -> str:
        parts = []
        for (text, st), w in zip(cells, widths):
            pad = " " * (w - len(text))
            parts.append(f"[{st}]{escape(text)}[/]{pad}" if color and st else (escape(text) if color else text) + pad)
        return (" " + "  ".join(parts)).rstrip()

    head = line([(h, "bold" if color else "") for h in headers])
    body = [line(r) for r in rows]
    out.print("\n".join([head, *body]), markup=color, highlight=False, soft_wrap=True, crop=False)


def _flag(name: str) -> str:
    return "" if name == "default" else f" --name {name}"


def _why_silent(h) -> str:
    """An agent that does not answer: on this machine its process says whether it exited or froze."""
    import psutil

    if h.ip not in ("127.0.0.1", "localhost", "::1"):
        return "does not answer"
    try:
        st = psutil.Process(h.pid).status()
    except psutil.Error:
        return "exited"
    if st == psutil.STATUS_ZOMBIE:
        return "exited"
    if st == psutil.STATUS_STOPPED:
        return "is stopped (frozen): `kill -CONT` resumes it"
    return "does not answer (hung?)"


def _fmt_bytes(n: float) -> str:
    from monarch._workbench.workspace import fmt_bytes

    return fmt_bytes(n)


def _fmt_ago(s: float) -> str:
    s = max(0, int(s))
    return f"{s}s" if s < 120 else (f"{s // 60}m" if s < 7200 else f"{s // 3600}h")


def _fmt_left(s: float) -> str:
    s = int(s)
    h, rem = divmod(s, 3600)
    mnt, sec = divmod(rem, 60)
    return f"{h}:{mnt:02d}:{sec:02d}"

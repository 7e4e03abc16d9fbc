"""``monarch profile``: a window of the reservation's activity as a Perfetto / chrome://tracing file."""

from __future__ import annotations

import time

import click

from monarch_cli.commands._common import Duration, handled, name_option, opts
from monarch_cli.output import err, escape, print_json


@click.command("profile")
@click.option("--time", "window_s", type=Duration(), default="10s", show_default=True,
              help="How long to record (30s, 2m); 0 is not allowed.")
@click.option("--output", "-o", "out_file", default="monarch_trace.json", show_default=True, metavar="FILE",
              help="Where to write the trace (Chrome trace-event JSON).")
@click.option("--since", "past_s", type=Duration(), default=None,
              help="Instead of waiting: the last DURATION already recorded (e.g. --since 5m).")
@name_option
@click.pass_context
def profile(ctx: click.Context, window_s: float, out_file: str, past_s: float | None, name: str | None) -> None:
    """Record the next --time of runs, procs and endpoint calls and write a trace that opens in Perfetto.

    One track per host (process) and per rank, proc or actor (thread).  Built from the telemetry
    tables (`monarch query`), so it covers every host of the reservation.
    """
    o = opts(ctx)
    with handled(ctx):
        import json
        import os

        from monarch._workbench.profile import collect
        from monarch._workbench.reserve import load_live
        from monarch._workbench.state import write_atomic

        record, _ = load_live(name, progress=lambda *a: None)
        now = time.time()
        if past_s is not None:
            start, end = now - past_s, now
        else:
            start = now
            with err.status(f"recording {window_s:g} s of activity …"):
                time.sleep(window_s)
            end = time.time()
        trace = collect(record, int(start * 1e6), int(end * 1e6))
        write_atomic(os.path.abspath(out_file), json.dumps(trace.to_json()).encode())
        spans = sum(1 for e in trace.events if e["ph"] != "M")
        if o.json:
            print_json({"file": os.path.abspath(out_file), "events": spans, "hosts": len(trace.pids),
                        "tracks": len(trace.tids), "seconds": round(end - start, 3)})
        else:
            err.print(f"wrote {spans} events on {len(trace.tids)} tracks of {len(trace.pids)} host(s) to "
                      f"{escape(out_file)}; open it in https://ui.perfetto.dev or chrome://tracing")

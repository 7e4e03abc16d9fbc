"""``monarch apply [module.attr]``: PyTorch Monarch's verb: a job object from your module becomes
the current context's reservation (applied, or the live one reused), then a readiness probe."""

from __future__ import annotations

import os
import sys
import time

import click

from monarch_cli.commands._common import handled, opts
from monarch_cli.output import err, escape, print_json


@click.command("apply")
@click.argument("module_path", required=False, metavar="[MODULE.ATTR]")
@click.pass_context
def apply(ctx: click.Context, module_path: str | None) -> None:
    """Reserve the job object MODULE.ATTR (e.g. myjob.job, imported from this directory) for the current context.

    A live reservation that can run it is reused; otherwise it is applied.  Then every host runs
    `true` and "Job is ready (N s)" is printed.  Without MODULE.ATTR the context's saved spec is
    applied again.  Our `monarch serve` does the same from flags.
    """
    o = opts(ctx)
    with handled(ctx):
        from monarch.job.job import Job, set_current_job

        t0 = time.monotonic()
        job = load_job(module_path)
        if module_path is not None:
            set_current_job(module_path)  # only once the path names a job: no half-written spec
        before = _live_job_id()
        job.state()
        running = job._running
        record = getattr(running, "record", None)
        reused = record is not None and record.job_id == before
        if record is not None and isinstance(running, Job):
            err.print(f"{'reusing' if reused else 'applied'} reservation {escape(record.name)!s} ({record.job_id}, "
                      f"{escape(record.spec.summary())})")
            probe(record)
        secs = time.monotonic() - t0
        if o.json:
            print_json({"ready": True, "seconds": round(secs, 3), "reused": reused,
                        "name": getattr(record, "name", None), "job_id": getattr(record, "job_id", None)})
        else:
            print(f"Job is ready ({secs:.0f}s)", flush=True)


def load_job(module_path: str | None):
    """The job object MODULE.ATTR names (imported relative to this directory), or the saved one."""
    from monarch.errors import UsageError
    from monarch.job.job import JobTrait, load_current_job

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if module_path is None:
        try:
            return load_current_job()
        except FileNotFoundError:
            raise UsageError("this context has no saved job spec", "`monarch apply MODULE.ATTR` (e.g. myjob.job) applies one") \
                from None
        except (ImportError, AttributeError, TypeError, ValueError) as e:
            raise UsageError(f"the saved job spec does not load: {e}", "`monarch apply MODULE.ATTR` applies another") \
                from None
    mod_name, _, attr = module_path.rpartition(".")
    if not mod_name or not attr:
        raise UsageError(f"{module_path!r} is not MODULE.ATTR", "e.g. `monarch apply myjob.job`")
    import importlib

    try:
        module = importlib.import_module(mod_name)
    except Exception as e:
        raise UsageError(f"cannot import module {mod_name!r} (from {os.getcwd()}): {type(e).__name__}: {e}",
                         "MODULE is a dotted path importable from this directory") from None
    job = getattr(module, attr, None)
    if job is None:
        raise UsageError(f"module {mod_name!r} has no attribute {attr!r}", "ATTR names the job object, e.g. job = ProcessJob(...)")
    if not isinstance(job, JobTrait):
        raise UsageError(f"{module_path} is an object of type {type(job).__name__}, not a job object",
                         "it must be a monarch.job job (ProcessJob, SlurmJob, ...)")
    return job


def _live_job_id() -> str | None:
    from monarch._workbench.state import StatePaths, load_state

    try:
        return load_state(StatePaths().resolve(None)).job_id
    except Exception:
        return None


def probe(record) -> None:
    """Every host runs `true`: the agents answer and can start processes."""
    from monarch.errors import RunError
    from monarch._workbench.run import RemoteRun

    hosts = sorted(record.hosts, key=lambda h: h.host_rank)
    rr = RemoteRun(record, hosts, ["true"], env={}, cwd=None, on_output=lambda *a: None)
    rr.start()
    if not rr.wait(60.0):
        rr.stop()
        raise RunError("the readiness probe did not finish in 60 s", "`monarch status` shows which agents answer")
    f = rr.outcome.first_failure
    if f is not None:
        raise RunError(f"readiness probe failed: rank {f.rank} on {f.host} {f.reason}")

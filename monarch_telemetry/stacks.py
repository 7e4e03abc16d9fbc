"""Live Python stacks with py-spy: ``monarch stack`` asks each host agent for them.

The host agent runs ``py-spy dump --json`` on each selected process (a proc agent, or
every Python process of a rank's command: torchrun's workers are children of the rank)
in parallel, each with a deadline, and turns the threads and frames into ``stacks`` rows.
py-spy reads the target's memory (ptrace): it needs the same user and, in some
containers, the SYS_PTRACE capability; a process it cannot read gives a row with
``error`` set instead of frames.

:func:`profile_svg` samples one process for a while (``py-spy record``) and answers the
flamegraph as SVG: the mesh admin API's ``POST /v1/pyspy_profile_svg``.

What it does not do: native (C/C++) frames or locals in dumps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil

#: How long one py-spy dump may take.
DUMP_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Target:
    """A process to take the stack of, and what it is."""

    pid: int
    kind: str  # "proc" | "rank"
    run_id: str | None = None
    rank: int | None = None


def py_spy() -> str | None:
    """The py-spy executable: beside this Python (the venv), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def _python_tree(pid: int) -> list[int]:
    """``pid`` and its descendants that run Python (a rank is often a shell or torchrun's tree)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return [pid]
    out = []
    for p in procs:
        try:
            name = " ".join([p.name(), *p.cmdline()[:1]]).lower()
        except psutil.Error:
            continue
        if "python" in name or p.pid == pid:
            out.append(p.pid)
    return out or [pid]


def dump(pid: int, timeout_s: float = DUMP_TIMEOUT_S) -> tuple[list[dict], str | None]:
    """(threads, error) for one process, from ``py-spy dump --json``."""
    exe = py_spy()
    if exe is None:
        return [], "py-spy is not installed on this host (pip install py-spy)"
    try:
        r = subprocess.run([exe, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True,
                           timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [], f"py-spy took more than {timeout_s:.0f} s"
    if r.returncode != 0:
        lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        first = lines[0] if lines else f"py-spy exited with {r.returncode}"
        if "ptrace" in (r.stderr or "").lower() or "permission" in (r.stderr or "").lower():
            first += " (py-spy needs ptrace: same user, or the SYS_PTRACE capability)"
        return [], first.removeprefix("Error: ")
    try:
        return json.loads(r.stdout), None
    except ValueError:
        return [], "py-spy printed something that is not JSON"


@dataclass(frozen=True, slots=True)
class Profile:
    """What :func:`profile_svg` gave: the SVG, or why none (``error``: unavailable, timeout, failed)."""

    svg: bytes | None
    error: str | None = None
    message: str = ""


def profile_svg(pid: int, duration_s: int, rate_hz: int, *, native: bool = False, threads: bool = False,
                nonblocking: bool = False) -> Profile:
    """Sample ``pid`` for ``duration_s`` seconds at ``rate_hz`` with ``py-spy record``; a flamegraph SVG."""
    import tempfile

    exe = py_spy()
    if exe is None:
        return Profile(None, "unavailable", "py-spy not available on this host (pip install py-spy)")
    # py-spy writes the SVG to a file: a private folder of ours, gone when we return.
    with tempfile.TemporaryDirectory(prefix="monarch-profile-") as tmp:
        out = os.path.join(tmp, "profile.svg")
        argv = [exe, "record", "--pid", str(pid), "--duration", str(int(duration_s)), "--rate", str(int(rate_hz)),
                "--format", "flamegraph", "--output", out]
        argv += ["--native"] * native + ["--threads"] * threads + ["--nonblocking"] * nonblocking
        # py-spy may take a few seconds past the duration to attach and write the file.
        limit = duration_s + DUMP_TIMEOUT_S
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=limit, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return Profile(None, "timeout", f"py-spy record took more than {limit:.0f} s")
        if r.returncode != 0 or not os.path.exists(out):
            # py-spy says why on its "Error:" line (a backtrace follows it); it exits 0 even then.
            lines = [ln.strip() for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
            why = next((ln for ln in lines if ln.startswith("Error:")), lines[-1] if lines else "")
            why = why.removeprefix("Error: ") or f"py-spy record exited with {r.returncode}"
            if "no stack counts" in why.lower():
                why = f"no samples: the proc ran no Python code in those {duration_s} s (idle threads are left out)"
            return Profile(None, "failed", why)
        with open(out, "rb") as f:
            return Profile(f.read())


def take(targets: list[Target], host: str, time_us: int) -> list[dict]:
    """``stacks`` rows for every target (one row per frame; one row with ``error`` when none)."""
    jobs: list[tuple[Target, int]] = []
    for t in targets:
        pids = _python_tree(t.pid) if t.kind == "rank" else [t.pid]
        jobs.extend((t, pid) for pid in pids)
    if not jobs:
        return []
    with ThreadPoolExecutor(min(8, len(jobs))) as pool:
        results = list(pool.map(lambda job: dump(job[1]), jobs))
    rows: list[dict] = []
    for (t, pid), (threads, error) in zip(jobs, results):
        base = {"time": time_us, "host": host, "pid": pid, "kind": t.kind, "run_id": t.run_id, "rank": t.rank}
        if error is not None:
            if t.kind == "rank" and pid != t.pid:
                continue  # a child that is not Python after all
            rows.append({**base, "thread_id": 0, "thread_name": None, "depth": 0, "function": "", "filename": "",
                         "line": 0, "error": error})
            continue
        for th in threads:
            for depth, fr in enumerate(th.get("frames") or []):
                rows.append({**base, "thread_id": int(th.get("thread_id") or 0), "thread_name": th.get("thread_name"),
                             "depth": depth, "function": fr.get("name") or "", "filename": fr.get("filename") or "",
                             "line": int(fr.get("line") or 0), "error": None})
    return rows


def stored_dump_rows(dump_id: str, proc_ref: str, result_json: str, host: str,
                     now: int) -> dict[str, tuple[int, list]]:
    """Rows for a py-spy result (Monarch's ``PySpyResult`` JSON) stored under ``dump_id``: ``stacks``
    (one per frame, or one with ``error`` for a result that is no stack) and ``pyspy_local_variables``,
    as :meth:`Table.append_columns` takes them ({table: (rows, columns)}).  Raises ValueError for JSON
    that is no PySpyResult."""
    from monarch_telemetry.schema import TABLES

    try:
        result = json.loads(result_json)
    except ValueError as e:
        raise ValueError(f"pyspy_result_json is not JSON: {e}") from None
    if not isinstance(result, dict) or len(result) != 1:
        raise ValueError("pyspy_result_json: expected one of {\"Ok\": ...}, {\"Failed\": ...}, {\"BinaryNotFound\": ...}")
    (tag, body), = result.items()
    body = body if isinstance(body, dict) else {}
    pid = int(body.get("pid") or 0)
    base = {"time": now, "host": host, "pid": pid, "kind": "proc", "run_id": None, "rank": None,
            "dump_id": dump_id, "proc_ref": proc_ref}
    stacks: list[dict] = []
    local_rows: list[dict] = []
    if tag != "Ok":
        why = body.get("stderr") or tag
        stacks.append({**base, "thread_id": 0, "thread_name": None, "depth": 0, "function": "", "filename": "",
                       "line": 0, "error": str(why)})
    for th in body.get("stack_traces") or []:
        tid = int(th.get("thread_id") or 0)
        for depth, fr in enumerate(th.get("frames") or []):
            stacks.append({**base, "thread_id": tid, "thread_name": th.get("thread_name"), "depth": depth,
                           "function": str(fr.get("name") or ""), "filename": str(fr.get("filename") or ""),
                           "line": int(fr.get("line") or 0), "error": None})
            for var in fr.get("locals") or []:
                local_rows.append({"dump_id": dump_id, "thread_id": tid, "frame_depth": depth,
                                   "name": str(var.get("name") or ""), "addr": var.get("addr"),
                                   "arg": var.get("arg"), "repr": var.get("repr")})
    out = {}
    for name, rows in (("stacks", stacks), ("pyspy_local_variables", local_rows)):
        if rows:
            cols = TABLES[name].column_names
            out[name] = (len(rows), [[r.get(c) for r in rows] for c in cols])
    return out

"""Record the frozen reservation the dashboard's snapshot tests draw (run by hand, output committed).

    .venv/bin/python -m tests.tui.record_frozen_reservation [DIR]   # default: tests/tui/data/frozen

Serves a real local reservation of 2 hosts and makes it show everything the dashboard
draws: a client holding an actor mesh (one endpoint call failed), a finished run whose
rank 1 failed (and rank 0 was stopped for it) after printing binary bytes and a 5,000-char line, a running run whose
rank 0 is paused in pdb, and a `monarch stack` dump.  Then saves every host's telemetry
with `monarch stop --save DIR/telemetry` and what the header and debug view need that is
no telemetry table (name, scheduler, job id, addresses, time left, the debug sessions as
`monarch debug list` sees them) in ``DIR/reservation.json``.

Re-record only when the telemetry schema or the views change what they read; the
snapshots under __snapshots__ then change too (``pytest tests/tui/test_snapshots.py
--snapshot-update``, after looking at the report).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MONARCH = [sys.executable, "-m", "monarch_cli.main"]
DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "frozen")

HOLDER = """
import sys
from monarch.actor import Actor, endpoint
from monarch.job import job_load

class Trainer(Actor):
    @endpoint
    def step(self, lr: float) -> float:
        if lr < 0:
            raise ValueError(f"negative learning rate {lr}")
        return lr * 2

procs = job_load().state().hosts.spawn_procs(per_host={"gpus": 2})
trainers = procs.spawn("trainers", Trainer)
trainers.step.call(0.1).get()
try:
    trainers.slice(gpus=0).step.call(-1.0).get()
except Exception:
    pass
print("ready", flush=True)
sys.stdin.read()
"""

FAILING = ("import os, sys, time\n"
           "r = int(os.environ['NODE_RANK'])\n"
           "print(f'rank {r} starting', flush=True)\n"
           "sys.stdout.write('bin\\x1b[2J\\x00\\x07' + 'x' * 5000 + '\\n'); sys.stdout.flush()\n"
           "if r == 1:\n"
           "    time.sleep(0.5)\n"
           "    raise ValueError('bad input 42')\n"
           "time.sleep(60)\n")

PAUSED = ("import os, time\n"
          "r = int(os.environ['NODE_RANK'])\n"
          "print(f'step {r} waiting', flush=True)\n"
          "if r == 0:\n"
          "    breakpoint()\n"
          "time.sleep(600)\n")


def main() -> None:
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DIR)
    work = tempfile.mkdtemp(prefix="frozen-res-")
    env = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}

    def monarch(*args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([*MONARCH, *args], cwd=work, env=env, capture_output=True, text=True, timeout=120, **kw)

    holder = paused = None
    try:
        r = monarch("serve", "--hosts", "2")
        assert r.returncode == 0, r.stderr
        holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=work, env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "ready"
        r = monarch("run", "--", "python3", "-c", FAILING)
        assert r.returncode == 1, r.stderr
        time.sleep(1.0)  # the finished run starts before the paused one, to the second
        paused = subprocess.Popen([*MONARCH, "run", "--", "python3", "-c", PAUSED], cwd=work, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from monarch._workbench.debug import list_sessions
        from monarch._workbench.reserve import describe, load_live
        from monarch._workbench.state import StatePaths

        record, _ = load_live(path=StatePaths(work).resolve(None))
        desc = describe(record)
        sessions = []
        deadline = time.monotonic() + 60
        while not sessions and time.monotonic() < deadline:
            time.sleep(0.3)
            sessions = list_sessions(record)
        assert sessions, "rank 0 never paused in pdb"
        r = monarch("stack")
        assert r.returncode == 0, r.stderr
        meta = {
            "name": record.name, "scheduler": record.spec.scheduler, "job_id": record.job_id,
            "time_left_s": desc.time_left_s if desc is not None else None, "taken_at": time.time(),
            "hosts": [{"host": h.host, "host_rank": h.host_rank, "addr": h.addr} for h in record.hosts],
            "debug": [s.to_dict() for s in sessions],
        }
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        r = monarch("stop", "--save", os.path.join(out, "telemetry"))
        assert r.returncode == 0, r.stderr
        with open(os.path.join(out, "reservation.json"), "w") as f:
            for s in meta["debug"]:
                s.pop("where", None)
            json.dump(meta, f, indent=1, sort_keys=True)
        print(f"recorded {out}")
    finally:
        for p in (paused, holder):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
        monarch("stop", "--force")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

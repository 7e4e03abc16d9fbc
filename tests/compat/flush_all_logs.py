"""Monarch's ``flush_all_proc_mesh_logs`` (what it runs after each IPython cell): lines aggregated per
window are printed on the client when it is called, not only when the window ends; the meshes it
flushes are this process's (``get_active_proc_meshes``; 0.7.0 goes on listing a stopped mesh there,
monarch lists only unstopped ones, so a flush never waits on stopped procs: this program checks
neither).  The procs, started after the program sent its stdout to a file, print there too.  Runs unchanged on monarch and
on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import asyncio
import os
import re
import sys
import tempfile

from monarch._src.actor.logging import flush_all_proc_mesh_logs
from monarch._src.actor.proc_mesh import get_active_proc_meshes
from monarch.actor import Actor, endpoint, this_host
from monarch.config import configured


class Talker(Actor):
    @endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)


def lines(path: str) -> list[str]:
    with open(path) as f:
        return [line for line in f.read().splitlines() if "flushed line" in line]


async def main(out_path: str) -> None:
    saved = os.dup(1)
    f = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(f, 1)
    os.close(f)
    try:
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        talker = pm.spawn("talker", Talker)
        await talker.initialized
        active = get_active_proc_meshes()
        # A window far longer than the program: only a flush prints these lines.
        await pm.logging_option(stream_to_client=True, aggregate_window_sec=600)
        await talker.say.call("flushed line")
        await asyncio.sleep(1)
        sys.stdout.flush()
        before = lines(out_path)
        flush_all_proc_mesh_logs()
        sys.stdout.flush()
        after = lines(out_path)
        await pm.stop()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    print("active:", pm in active)
    print("before flush:", before)
    # Which rank's line stands for the group is whichever came first.
    print("after flush:", [re.sub(r"\[\d+\] flushed", "[r] flushed", s) for s in after])


with configured(enable_log_forwarding=True), tempfile.TemporaryDirectory() as d:
    asyncio.run(main(os.path.join(d, "out")))

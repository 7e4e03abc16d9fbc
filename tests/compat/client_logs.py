"""Procs' output on the client, as Monarch's ``ProcMesh.logging_option`` gives it: with log
forwarding on, lines are streamed to the client one by one (``[host pid] [rank] line``) or
aggregated per window (``[N similar log lines] [rank] line``, printed when the window ends, when
aggregation is turned off, and on a flush), only at or above the level asked for; procs started on
this host after the program redirected its stdout write there; the client's own log records carry
``[actor=<root>]``.  (torchmonarch 0.7.0 goes on streaming after ``stream_to_client=False``, which
its documentation says stops it: monarch stops; this program checks neither.)  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them).
"""

import asyncio
import io
import logging
import os
import re
import sys
import tempfile

from monarch.actor import Actor, endpoint, this_host
from monarch.config import configured


class Talker(Actor):
    @endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)

    @endpoint
    def complain(self, text: str) -> None:
        logging.getLogger().error(text)
        sys.stderr.flush()


def redirect(fd: int, path: str) -> int:
    saved = os.dup(fd)
    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(f, fd)
    os.close(f)
    return saved


client_records: list = []


async def main(out_path: str, err_path: str) -> None:
    saved = [redirect(1, out_path), redirect(2, err_path)]
    try:
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        talker = pm.spawn("talker", Talker)
        await talker.say.call("raw only")
        await asyncio.sleep(1)  # torchmonarch 0.7.0's host copies it to its stdout some time later
        await pm.logging_option(stream_to_client=True, aggregate_window_sec=None, level=logging.ERROR)
        await asyncio.sleep(1)
        await talker.say.call("one by one")
        await talker.complain.call("complaint shown")
        pm._logging_manager.flush()
        await pm.logging_option(stream_to_client=True, aggregate_window_sec=None, level=logging.CRITICAL)
        await asyncio.sleep(1)  # torchmonarch 0.7.0 applies the level some time after logging_option returns
        await talker.complain.call("complaint hidden")
        await pm.logging_option(stream_to_client=True, aggregate_window_sec=600)
        for _ in range(3):
            await talker.say.call("grouped line")
        await asyncio.sleep(1)
        await pm.logging_option(stream_to_client=True, aggregate_window_sec=None)  # prints the window
        records = io.StringIO()
        handler = logging.StreamHandler(records)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger = logging.getLogger("client_logs")
        logger.addHandler(handler)
        logger.error("from the client")
        client_records.append(records.getvalue().strip())
        await pm.stop()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)


with tempfile.TemporaryDirectory() as d, configured(enable_log_forwarding=True):
    out_path, err_path = os.path.join(d, "out"), os.path.join(d, "err")
    asyncio.run(main(out_path, err_path))
    out = open(out_path).read().splitlines()
    err = open(err_path).read().splitlines()

streamed = re.compile(r"^\[[^\]]+\] \[(\d)\] (.*)$")  # [host proc] [rank] line
print("raw lines reach the redirected stdout:", sum(line == "raw only" for line in out))
print("one by one:", sorted(m.group(1) for m in map(streamed.match, out) if m and m.group(2) == "one by one"))
print("complaint on stderr, one by one:",
      sorted(m.group(1) for m in map(streamed.match, err) if m and m.group(2).endswith("complaint shown")))
print("below the level:", [line for line in out + err if "complaint hidden" in line])
# a group shows its first line: either rank's, whichever came first
plain = [re.sub(r"\x1b\[\d+m", "", line) for line in out if "similar log lines" in line]
print("aggregated:", [re.sub(r"^(\[\d+ similar log lines\]) \[\d\] ", r"\1 ", line) for line in plain])
print("window header and footer:", any(">>> Aggregated Logs (" in line for line in out),
      any("<<< Aggregated Logs (" in line for line in out))
print("client record:", client_records)
print("done")

"""A call still out when its ``asyncio.run`` ends (a program stopped at Ctrl-C, as Monarch's
python/examples end): when the call fails later, at its procs' stop, no one awaits it any more and
nothing is said of it (it was said as tracebacks, 'Event loop is closed', one per call).
Runs unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import asyncio
import os
import sys
import tempfile

from monarch.actor import Actor, endpoint, this_host


class Slow(Actor):
    @endpoint
    async def wait(self) -> None:
        await asyncio.sleep(3600)

    @endpoint
    async def ping(self) -> int:
        return 1


procs = this_host().spawn_procs(per_host={"gpus": 2})
slow = procs.spawn("slow", Slow)
print("ready:", slow.ping.call().get().values())


async def main() -> None:
    calls = [asyncio.ensure_future(slow.wait.call()) for _ in range(3)]
    await asyncio.sleep(0.5)
    print("calls out:", sum(not c.done() for c in calls))


asyncio.run(main())  # cancels the three waits: their calls stay out
with tempfile.TemporaryFile() as said:
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(said.fileno(), 2)
    try:
        procs.stop().get()
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
    said.seek(0)
    text = said.read().decode(errors="replace")
print("tracebacks at the stop:", text.count("Traceback"))
print("done")

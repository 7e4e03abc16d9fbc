"""``hold_gil_for_test`` (Monarch's test utility, which its GIL-stall test uses): a thread holds
the GIL for the time asked, after the delay asked, and returns at once; no other Python thread runs
meanwhile; actor calls made during the hold are answered after it.  Runs unchanged on monarch and on
torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).  Only lower bounds on the times
are printed (a loaded machine makes them longer, never shorter).
"""

import threading
import time

from monarch._rust_bindings.monarch_hyperactor.actor_mesh import hold_gil_for_test
from monarch.actor import Actor, endpoint, this_host


class Echo(Actor):
    @endpoint
    async def echo(self, i: int) -> int:
        return i


procs = this_host().spawn_procs(per_host={"gpus": 1})
echo = procs.spawn("echo", Echo)
print("before:", echo.echo.call_one(1).get())

ticks: list = []
stop = threading.Event()


def tick() -> None:
    while not stop.is_set():
        ticks.append(time.monotonic())
        time.sleep(0.01)


ticker = threading.Thread(target=tick)
ticker.start()
start = time.monotonic()
hold_gil_for_test(delay_secs=0.3, hold_secs=1.5)
print("returns before the hold:", time.monotonic() - start < 0.3)
time.sleep(0.1)
futures = [echo.echo.call_one(i) for i in range(50)]  # sent as the hold begins
print("answers after the hold:", sum(f.get() for f in futures) == sum(range(50)))
time.sleep(2.0)
stop.set()
ticker.join()
gap = max(b - a for a, b in zip(ticks, ticks[1:]))
print("another thread stood still for the hold:", gap >= 1.4)
procs.stop().get()
print("done")

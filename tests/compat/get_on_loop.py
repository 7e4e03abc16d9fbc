"""``Future.get()`` called where an asyncio loop is running in the same thread (an ``async def``
that blocks on a call instead of awaiting it, as Monarch's dining_philosophers.py and
rapid_spawn_exit_stress.py examples do): it still answers, with a ``UserWarning`` that it blocks
the loop; awaiting does not warn, nor does ``get()`` with no loop, nor a synchronous call of
monarch's own (``spawn_procs``) made there.  Runs unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py
compares them).
"""

import asyncio
import warnings

from monarch.actor import Actor, endpoint, this_host, this_proc


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


echo = this_proc().spawn("echo", Echo)


def warned(fn) -> tuple:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        value = fn()
    return value, any(issubclass(w.category, UserWarning) and "get()" in str(w.message) for w in seen)


async def main() -> None:
    print("get on a running loop:", *warned(lambda: echo.echo.call_one(1).get()))
    fut = echo.echo.call_one(2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = await fut
    print("await:", got, any(issubclass(w.category, UserWarning) for w in seen))
    procs, said = warned(lambda: this_host().spawn_procs(per_host={"gpus": 1}))
    print("spawn_procs on a running loop warns:", said)
    procs.stop().get()


asyncio.run(main())
print("get with no loop:", *warned(lambda: echo.echo.call_one(3).get()))
print("done")

"""A proc mesh's readiness: every observer hears it, late or after another was dropped.

A mesh whose bootstrap raises still comes back from spawn_procs; the failure is what each
look at ``initialized`` (and a use of the mesh) raises.  Runs unchanged on monarch and on
torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares them).
"""

import warnings

import monarch.actor
from monarch.actor import Actor, endpoint, this_host

warnings.simplefilter("ignore", RuntimeWarning)  # a dropped observer is a never-awaited coroutine in Monarch
monarch.actor.unhandled_fault_hook = lambda failure: None


def refuse_to_start() -> None:
    raise RuntimeError("this bootstrap refuses")


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


def seen(fn) -> str:
    try:
        return repr(fn())
    except Exception as e:
        return f"{type(e).__name__} (names its cause: {'this bootstrap refuses' in str(e)})"


ready = this_host().spawn_procs(per_host={"gpus": 2})
dropped = ready.initialized  # an observer made and dropped before the mesh was up
del dropped
print("ready, first look:", seen(lambda: ready.initialized.get()))
print("ready, second look:", seen(lambda: ready.initialized.get()))
print("ready, a slice:", seen(lambda: ready.slice(gpus=1).initialized.get()))

broken = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=refuse_to_start)
print("spawn_procs returned a mesh")
dropped = broken.initialized
del dropped
print("broken, first look:", seen(lambda: broken.initialized.get()))
print("broken, second look:", seen(lambda: broken.initialized.get()))
print("broken, used:", seen(lambda: broken.spawn("echo", Echo).echo.call_one(1).get()))
print("ready still works:", seen(lambda: [v for _, v in ready.spawn("echo", Echo).echo.call(7).get()]))
ready.stop().get()
print("done")

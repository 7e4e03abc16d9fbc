"""Monarch's smaller public names, used as a program uses them; prints what it sees.

Runs unchanged on monarch and on torchmonarch 0.7.0 (tests/compat/test_api_compat.py compares
the two outputs line by line).
"""

import asyncio

from monarch._src.actor.mock import patch_actor
from monarch._src.actor.telemetry import TracingForwarder
from monarch.actor import (
    Actor,
    ChannelTransport,
    ProcId,
    Uid,
    endpoint,
    get_meter,
    returns_future,
    span,
    this_host,
    traced,
)
from monarch.job import LocalJob, MeshAdminConfig, TelemetryConfig, new_service_proc_id
from monarch.timer import ExecutionTimer

# identities
u = Uid.instance_from_value(100, "trainer")
print("uid", u, u.label, u.is_instance, u.is_singleton, u.instance_value)
print("uid round trip", Uid.from_string(str(u)) == u, Uid.instance_from_value(100, "other") == u)
print("singleton", Uid.from_string("controller"), Uid.from_string("controller").is_singleton)
print("values", [str(Uid.instance_from_value(v)) for v in (0, 9, 57, 58, 2**64 - 1)])
print("proc id", ProcId(u), ProcId.from_string("service<J>").label, ProcId.from_string("service<J>").uid.instance_value)
print("service id", str(new_service_proc_id()).startswith("service<"))
print("transports", all(hasattr(ChannelTransport, n) for n in ("Unix", "TcpWithHostname", "Tls", "Local")))


# futures from coroutines
@returns_future
async def double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


print("returns_future get", double(21).get())


async def main() -> None:
    f = double(4)
    print("returns_future await", await f, await f)
    print("as_asyncio", await double(5).as_asyncio())


asyncio.run(main())


# tracing
@traced
def traced_fn() -> int:
    return 3


@traced(name="named")
def named_fn() -> int:
    return 4


with span("outer"):
    print("traced", traced_fn(), named_fn())
get_meter().create_counter("requests").add(2, {"route": "a"})
get_meter().create_histogram("latency").record(1.5)
print("forwarder is a handler", isinstance(TracingForwarder(), __import__("logging").Handler))

# job services' configuration
print(TelemetryConfig())
print(MeshAdminConfig())
state = LocalJob().state(cached_path=None)
print("job state services", state.query_engine, state.admin_url, state.telemetry_url)

# timer
with ExecutionTimer.time("section", use_cpu=True):
    sum(range(1000))
print("timer count", ExecutionTimer.summary()["section"]["count"])


# patch_actor
class Real(Actor):
    @endpoint
    def who(self) -> str:
        return "real"


class Fake(Actor):
    @endpoint
    def who(self) -> str:
        return "fake"


procs = this_host().spawn_procs(per_host={"gpus": 1})
with patch_actor(Real, Fake):
    print("patched", procs.spawn("a", Real).who.call_one().get())
print("unpatched", procs.spawn("b", Real).who.call_one().get())
procs.stop().get()
print("done")

"""A message built by hand for a port nobody has comes back to its sender.

An actor sends a ``PythonMessage`` through a ``PortRef`` to an address that is no process of the
job.  With ``_handle_undeliverable_message`` returning True the actor sees the returned envelope
(its sender, destination and why) and goes on.  (Without it, Monarch's docs say the message is
escalated as an error, and its test of that expects a fault at the client: ours fails the actor and
the client's hook hears of it, tests/monarch/test_mailbox_objects.py; torchmonarch 0.7.0 showed no
fault within a minute, so that half is not compared here.)  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_api_compat.py compares them).
"""

import time

import monarch.actor
from monarch._rust_bindings.monarch_hyperactor.actor import PythonMessage, PythonMessageKind
from monarch._rust_bindings.monarch_hyperactor.buffers import Buffer
from monarch._rust_bindings.monarch_hyperactor.mailbox import PortId, PortRef
from monarch._rust_bindings.monarch_hyperactor.proc import ActorAddr
from monarch.actor import Actor, context, endpoint, this_host

faults: list = []


def hook(failure) -> None:
    faults.append(str(failure))


monarch.actor.unhandled_fault_hook = hook


class Sender(Actor):
    def __init__(self, handle: bool) -> None:
        self.handle = handle
        self.envelope = None

    @endpoint
    def send_nowhere(self) -> str:
        buf = Buffer()
        buf.write(b"\x80\x04K*.")  # pickle of 42
        where = PortId(actor_id=ActorAddr(addr="local:0", proc_name="nowhere", actor_name="nobody"), port=77)
        PortRef(where).send(context().actor_instance._as_rust(),
                            PythonMessage(PythonMessageKind.Result(None), buf.freeze(), []))
        return "sent"

    @endpoint
    def returned_envelope(self):
        e = self.envelope
        if e is None:
            return None
        return (str(e.sender()) != "", "nobody" in str(e.dest()), bool(e.error_msg()))

    def _handle_undeliverable_message(self, message) -> bool:
        if not self.handle:
            return False
        self.envelope = message
        return True


procs = this_host().spawn_procs(per_host={"gpus": 1})
careful = procs.spawn("careful", Sender, True)
print("careful:", careful.send_nowhere.call_one().get())
deadline = time.monotonic() + 60
while (seen := careful.returned_envelope.call_one().get()) is None and time.monotonic() < deadline:
    time.sleep(0.05)
print("envelope: sender, destination, reason:", seen)
print("careful goes on:", careful.send_nowhere.call_one().get())
print("faults:", len(faults))

procs.stop().get()
print("done")

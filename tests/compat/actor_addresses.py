"""Monarch's hand-built ids, as its programs and tools print and read them: an ``ActorAddr`` (a
named proc's root actor at a channel address) prints as ``actor.proc@location`` and reads back
from that text, equal and of equal hash; its names and ``proc_id``; a ``PortId`` prints as
``actor.proc:port@location``.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_refs_compat.py compares them).
"""

from monarch._rust_bindings.monarch_hyperactor.mailbox import PortId
from monarch._rust_bindings.monarch_hyperactor.proc import ActorAddr

for where in ("local:3", "tcp:127.0.0.1:29500"):
    trainer = ActorAddr(addr=where, proc_name="worker", actor_name="trainer")
    print("printed:", trainer)
    print("names:", trainer.uid, trainer.pid, trainer.label, trainer.proc_label, trainer.actor_name,
          trainer.proc_name)
    print("proc id:", trainer.proc_id, "root:", trainer.is_root, "address:", trainer.addr)
    again = ActorAddr.from_string(str(trainer))
    print("read back:", again == trainer, hash(again) == hash(trainer), again.addr)
    print("another actor differs:", ActorAddr(addr=where, proc_name="worker", actor_name="reader") != trainer)
    port = PortId(actor_id=trainer, port=12)
    print("port:", port, port.index, port.actor_id == trainer)
print("done")

"""A ``Port`` travels: an actor opens a channel and hands its port to whoever asks (as a return value,
one at a time or through ``.stream()``), and whoever unpickles it sends from itself.  A port built
by hand with Monarch's ``Port(port_ref, instance, rank)`` for an address no process has is returned
by the actor that made it; the actor that sends through it, not the maker, gets the message back
(``_handle_undeliverable_message``, the sender named by its own actor id), and no client context is
made in an actor's process along the way.  Runs unchanged on monarch and on torchmonarch 0.7.0
(tests/compat/test_refs_compat.py compares them).
"""

import time

from monarch._rust_bindings.monarch_hyperactor.mailbox import PortId, PortRef
from monarch._rust_bindings.monarch_hyperactor.proc import ActorAddr
import monarch._src.actor.actor_mesh as actor_mesh
from monarch.actor import Actor, Channel, Port, context, endpoint, this_host


class Mailroom(Actor):
    def __init__(self) -> None:
        self.boxes: list = []

    @endpoint
    async def new_box(self) -> Port:
        port, receiver = Channel[str].open()
        self.boxes.append(receiver)
        return port

    @endpoint
    async def letters(self) -> list:
        return [await box.recv() for box in self.boxes]

    @endpoint
    async def opened(self) -> int:
        return len(self.boxes)

    @endpoint
    async def box_for_nobody(self) -> Port:
        nowhere = PortId(actor_id=ActorAddr(addr="local:0", proc_name="closed", actor_name="nobody"), port=404)
        return Port(PortRef(nowhere), context().actor_instance._as_rust(), None)


class Courier(Actor):
    """Asks the mailroom for ports and posts through them (its endpoints plain ``def``)."""

    def __init__(self, room: Mailroom) -> None:
        self.room = room
        self.bounced: list = []

    @endpoint
    def post(self, text: str) -> bool:
        self.room.new_box.call_one().get().send(text)
        return actor_mesh._client_context._val is None  # the module's: a lock does not pickle

    @endpoint
    def post_nowhere(self) -> None:
        self.room.box_for_nobody.call_one().get().send("lost")

    @endpoint
    def bounced_from_me(self) -> list:
        me = str(context().actor_instance.actor_id)
        return [who == me for who in self.bounced]

    def _handle_undeliverable_message(self, message) -> bool:
        self.bounced.append(str(message.sender()))
        return True


class StreamCourier(Actor):
    """The same with ``async def`` endpoints, the ports coming from ``.stream()``."""

    def __init__(self, room: Mailroom) -> None:
        self.room = room
        self.bounced: list = []

    @endpoint
    async def post(self, text: str) -> bool:
        for port in self.room.new_box.stream():
            (await port).send(text)
        return actor_mesh._client_context._val is None  # the module's: a lock does not pickle

    @endpoint
    async def post_nowhere(self) -> None:
        for port in self.room.box_for_nobody.stream():
            (await port).send("lost")

    @endpoint
    async def bounced_from_me(self) -> list:
        me = str(context().actor_instance.actor_id)
        return [who == me for who in self.bounced]

    def _handle_undeliverable_message(self, message) -> bool:
        self.bounced.append(str(message.sender()))
        return True


def bounced(courier) -> list:
    for _ in range(600):
        seen = courier.bounced_from_me.call_one().get()
        if seen:
            return seen
        time.sleep(0.05)
    return []


procs = this_host().spawn_procs(per_host={"gpus": 3})
room = procs.slice(gpus=0).spawn("mailroom", Mailroom)
courier = procs.slice(gpus=1).spawn("courier", Courier, room)
streamer = procs.slice(gpus=2).spawn("streamer", StreamCourier, room)

print("courier posts, no client made:", courier.post.call_one("from a courier").get())
print("streamer posts, no client made:", streamer.post.call_one("from a stream").get())
room.new_box.call_one().get().send("from the client")
print("letters:", room.letters.call_one().get())

courier.post_nowhere.call_one().get()
print("returned to the courier itself:", bounced(courier))
streamer.post_nowhere.call_one().get()
print("returned to the streamer itself:", bounced(streamer))
print("boxes opened:", room.opened.call_one().get())

procs.stop().get()
print("done")

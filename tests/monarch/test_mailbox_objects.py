"""Monarch's hand-built mailbox objects (``PortRef``, ``PortId``, ``ActorAddr``, ``PythonMessage``,
``Buffer``, ``UndeliverableMessageEnvelope``; compatibility, ``monarch.actor._mailbox``): a message
sent to a real port arrives; one that cannot be delivered comes back to its sender, whose
``_handle_undeliverable_message`` handles it or, by default, fails the actor."""

from __future__ import annotations

import queue

import pytest

import monarch.actor
from monarch.actor import Channel, SupervisionError, this_host
from tests.monarch.actors import HandMadeSender

T = 30


@pytest.fixture
def faults(monkeypatch):
    q: queue.Queue = queue.Queue()
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", q.put)
    return q


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    yield pm
    pm.stop().get(timeout=T)


def test_a_message_to_a_real_port_arrives(procs):
    port, recv = Channel.open()
    sender = procs.spawn("hand_made", HandMadeSender)
    ref = port._ref
    sender.send_to.call_one(ref.addr, ref.port_id, {"answer": 42}).get(timeout=T)
    assert recv.recv().get(timeout=T) == {"answer": 42}
    sender.stop().get(timeout=T)


def test_an_undeliverable_message_comes_back_to_its_handler(procs):
    sender = procs.spawn("handles", HandMadeSender, True)
    sender.send_to.call_one("local:0", 1234, "lost").get(timeout=T)
    [(who, dest, why)] = sender.seen.call_one().get(timeout=T)
    assert "handles" in who and dest.actor_id.addr == "local:0" and dest.index == 1234 and "no route" in why
    sender.seen.call_one().get(timeout=T)  # handled: the actor goes on
    sender.stop().get(timeout=T)


def test_an_unhandled_undeliverable_message_fails_the_sender(faults):
    pm = this_host().spawn_procs(per_host={"gpus": 1})  # its proc is poisoned by the failure
    try:
        sender = pm.spawn("careless", HandMadeSender)
        sender.send_to.call_one("local:0", 7, "lost").get(timeout=T)  # the send itself returns
        failure = faults.get(timeout=T)
        assert failure.mesh_name == "careless" and "undeliverable message to" in failure.report()
        with pytest.raises(SupervisionError, match="undeliverable message to"):
            sender.seen.call_one().get(timeout=T)
    finally:
        pm.stop().get(timeout=T)

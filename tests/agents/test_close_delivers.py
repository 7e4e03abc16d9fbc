"""Closing a mailbox delivers what it sent to a peer on another host (ZeroMQ over CURVE TCP) whose
connection was still being made: "send, then exit" must deliver (a proc's last reply, a client's last
call), within a bounded wait.

The receiver is a process of its own, stopped (SIGSTOP) while the sender sends and closes, so the
connection cannot be made before the close; it is let go once the sender has had time to exit, as
it did before: the message must arrive all the same.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from monarch_agents.keys import JobKeys
from tests.helpers import ROOT, wait_gone

pytestmark = pytest.mark.timeout(120)

RECEIVER = """
import json, sys
from monarch_agents.keys import JobKeys
from tests.agents.test_transport import Box
box = Box(JobKeys(**json.loads(sys.stdin.readline())), "receiver", local_ipc=False)
print(box.addr, flush=True)
while True:
    msg = box.received.get()
    print(type(msg).__name__, msg.reply.port_id, flush=True)
"""

# A process's own mailbox, in the process's ZeroMQ context, as a proc's or a client's is.
SENDER = """
import json, sys
from monarch_agents import messages as m
from monarch_agents.keys import JobKeys
from monarch_agents.transport import Mailbox
mb = Mailbox(JobKeys(**json.loads(sys.stdin.readline())), lambda msg: None, name="sender", local_ipc=False)
mb.start()
mb.send(sys.argv[1], m.Ping(m.PortRef(sys.argv[1], 7)))
print("closing", flush=True)
mb.close()
"""


def _start(src: str, keys: JobKeys, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", src, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    p.stdin.write(json.dumps(keys.as_dict()) + "\n")
    p.stdin.flush()
    return p


def test_a_message_sent_just_before_close_reaches_a_peer_still_connecting():
    keys = JobKeys.generate()
    receiver = _start(RECEIVER, keys)
    sender = None
    try:
        addr = receiver.stdout.readline().strip()
        assert addr.startswith("tcp://"), addr
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in receiver.stdout], daemon=True).start()
        os.kill(receiver.pid, signal.SIGSTOP)  # accepts no connection's handshake until let go
        sender = _start(SENDER, keys, addr)
        assert sender.stdout.readline() == "closing\n"
        try:
            sender.wait(timeout=1.5)  # a sender that did not wait for delivery is gone by now
        except subprocess.TimeoutExpired:
            pass
        os.kill(receiver.pid, signal.SIGCONT)
        assert lines.get(timeout=30) == "Ping 7\n"
        assert sender.wait(timeout=30) == 0
    finally:
        os.kill(receiver.pid, signal.SIGCONT)
        for p in (receiver, sender):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait()
    assert wait_gone([receiver.pid, sender.pid]) == []

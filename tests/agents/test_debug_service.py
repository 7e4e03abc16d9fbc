"""The host agent's debug service, message by message: a rank's session, the relay, and who may connect."""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid

import psutil
import pytest

from monarch_agents import debug_rank as proto
from monarch_agents import messages as m
from tests.helpers import StreamInbox, start_host_agent, wait_gone

pytestmark = pytest.mark.timeout(60)

T = 30




@pytest.fixture
def agent(client, tmp_path):
    a = start_host_agent(client.keys, tmp_path, hostname="dbghost")
    yield a
    a.stop()
    assert wait_gone([a.pid] + a.children()) == []


def _run(client, agent, inbox, argv, env=None) -> str:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    client.send(agent.addr, m.RunCommand(run_id, argv, env or {}, None, inbox.port.ref, 0, client.addr))
    return run_id


def _output(inbox) -> str:
    return inbox.next(m.RunOutput).data.decode()


def _line(inbox) -> str:
    """The next line the run prints (it may come in pieces)."""
    out = ""
    while not out.endswith("\n"):
        out += _output(inbox)
    return out


def test_a_session_relayed_through_the_agent(client, agent):
    inbox = StreamInbox(client)
    run_id = _run(client, agent, inbox, [sys.executable, "-c", "x = 5\nbreakpoint()\nprint('after', x * 2)"])
    waiting = inbox.next(m.DebugWaiting)
    assert waiting.run_id == run_id and waiting.session["rank"] == 0 and waiting.session["host"] == "dbghost"
    deadline = time.monotonic() + T
    while True:  # registered first, then pdb asks for its first command
        [s] = client.request(agent.addr, lambda port: m.DebugList(port)).get(timeout=T)
        if s["waiting"] or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert s["waiting"] and s["function"] == "<module>" and s["held_by"] == "" and s["run_id"] == run_id
    r = client.request(agent.addr, lambda port: m.DebugAttach(s["sid"], client.addr, "tester", port, inbox.port.ref)).get(timeout=T)
    assert r["waiting"] and r["replay"].endswith(b"(Pdb) ")
    client.send(agent.addr, m.DebugInput(s["sid"], client.addr, b"p x * 7\n"))
    out = b""
    while True:
        msg = inbox.next(m.DebugOutput)
        out += msg.data
        if msg.waiting:
            break
    assert out == b"35\n(Pdb) "
    [s] = client.request(agent.addr, lambda port: m.DebugList(port)).get(timeout=T)
    assert s["held_by"] == "tester"
    client.send(agent.addr, m.DebugInput(s["sid"], client.addr, b"c\n"))
    seen = _until_exited(inbox)
    assert seen[m.DebugEnded].reason == "rank 0 continued"
    assert seen[m.RunOutput] == b"after 10\n" and seen[m.RunExited].exit_code == 0
    assert client.request(agent.addr, lambda port: m.DebugList(port)).get(timeout=T) == []


def _until_exited(inbox) -> dict:
    """Messages until the rank exits, by type (its output joined): the session's end and the rank's
    output come from different threads of the agent, in any order."""
    seen: dict = {}
    while m.RunExited not in seen:
        msg = inbox.q.get(timeout=T)
        if type(msg) is m.RunOutput:
            seen[m.RunOutput] = seen.get(m.RunOutput, b"") + msg.data
        else:
            seen[type(msg)] = msg
    return seen


def _until_waiting(inbox) -> bytes:
    out = b""
    while True:
        msg = inbox.next(m.DebugOutput)
        out += msg.data
        if msg.waiting:
            return out


INTERRUPTED = "x = 5\nbreakpoint()\ny = x + 1\nprint('after', y, flush=True)\n"


@pytest.mark.parametrize("then", [["c"], ["n", "c"]], ids=["then-continue", "then-next"])
def test_an_interrupted_command_then_continue_or_next_at_once_exits_0(client, agent, then):
    """Ctrl-C stops the command pdb runs; `c` or `n` right after it (no other command between) lets the
    rank run to its end with exit 0, as with no interrupt.  (CPython marks an interrupted `eval()` of a
    string, pdb's `p`, as an unhandled Ctrl-C, and kills itself with SIGINT at exit unless it is cleared.)"""
    inbox = StreamInbox(client)
    _run(client, agent, inbox, [sys.executable, "-c", INTERRUPTED])
    sid = inbox.next(m.DebugWaiting).session["sid"]
    r = client.request(agent.addr, lambda port: m.DebugAttach(sid, client.addr, "tester", port, inbox.port.ref)).get(timeout=T)
    if not r["waiting"]:
        _until_waiting(inbox)
    # The rank's own stdout says when the command runs: the interrupt lands inside it, not before.
    client.send(agent.addr, m.DebugInput(sid, client.addr, b"p print('sleeping', flush=True) or __import__('time').sleep(60)\n"))
    printed = ""
    while printed != "sleeping\n":  # (the line may come in pieces)
        printed += _output(inbox)
        assert "sleeping\n".startswith(printed), printed
    client.send(agent.addr, m.DebugInterrupt(sid, client.addr))
    assert _until_waiting(inbox) == b"*** KeyboardInterrupt\n(Pdb) "
    if then[0] == "n":
        client.send(agent.addr, m.DebugInput(sid, client.addr, b"n\n"))
        assert _until_waiting(inbox) == b"> <string>(4)<module>()\n(Pdb) "  # stepped to the print
    client.send(agent.addr, m.DebugInput(sid, client.addr, b"c\n"))
    seen = _until_exited(inbox)
    assert seen[m.DebugEnded].reason == "rank 0 continued"
    assert seen[m.RunOutput] == b"after 6\n"
    assert seen[m.RunExited].exit_code == 0


_SENDS_GARBAGE = """\
import os, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect("\\0" + os.environ["MONARCH_DEBUG_SOCK"])
s.sendall(b"\\xff" * 64)
try:
    print("closed" if s.recv(1) == b"" else "answered", flush=True)
except ConnectionResetError:  # closed with the garbage unread
    print("closed", flush=True)
"""


def test_only_the_agents_children_may_open_a_session(client, agent):
    inbox = StreamInbox(client)
    _run(client, agent, inbox, ["sh", "-c", 'echo "$MONARCH_DEBUG_SOCK $PYTHONBREAKPOINT"'])
    name, hook = _output(inbox).split()
    assert hook == "monarch_breakpoint.set_trace"
    # A process of the same user that the agent did not start (this test) knows the socket's name,
    # says it is one of the agent's ranks, and even brings the secret an older agent asked for: nothing.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(T)
        s.connect("\0" + name)
        try:
            proto.send_frame(s, proto.HELLO, {"token": "0" * 32, "rank": 0, "pid": agent.children()[0]})
            assert proto.recv_frame(s) is None  # closed without a WELCOME
        except (ConnectionResetError, BrokenPipeError):  # closed with nothing read
            pass
    # One of its ranks sending garbage instead of a hello: closed too, and the agent lives on.
    _run(client, agent, inbox, [sys.executable, "-c", _SENDS_GARBAGE])
    assert _line(inbox) == "closed\n"
    assert client.request(agent.addr, lambda port: m.DebugList(port)).get(timeout=T) == []
    # The user's own PYTHONBREAKPOINT for a run wins.
    _run(client, agent, inbox, ["sh", "-c", 'echo "$PYTHONBREAKPOINT"'], env={"PYTHONBREAKPOINT": "0"})
    assert _output(inbox) == "0\n"


_SPAWNS_A_CHILD = """\
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
breakpoint()
child.kill()
child.wait()
print("after", flush=True)
"""


def _proc_text(pid: int, what: str) -> str:
    with open(f"/proc/{pid}/{what}", "rb") as f:
        return f.read().replace(b"\0", b"\n").decode(errors="replace")


def test_no_secret_in_a_ranks_environ_or_argv_nor_in_what_it_starts(client, agent):
    """House rule: no key in argv or environ.  A rank paused in breakpoint(), and a process it started,
    have no debug token and none of the job's secret keys in /proc/PID/environ or /proc/PID/cmdline
    (they had MONARCH_DEBUG_TOKEN, which any process the user's program started inherited), and the
    session still opens and continues."""
    inbox = StreamInbox(client)
    _run(client, agent, inbox, [sys.executable, "-c", _SPAWNS_A_CHILD])
    printed, waiting = "", None
    while not printed.endswith("\n") or waiting is None:  # from two threads of the agent, in any order
        msg = inbox.q.get(timeout=T)
        if type(msg) is m.RunOutput:
            printed += msg.data.decode()
        elif type(msg) is m.DebugWaiting:
            waiting = msg
    rank, child = waiting.session["pid"], int(printed)
    secrets = [v for k, v in client.keys.as_dict().items() if k.endswith("_secret") and v]
    assert len(secrets) >= 2
    for pid in (rank, child):
        environ, cmdline = _proc_text(pid, "environ"), _proc_text(pid, "cmdline")
        assert proto.SOCK_ENV in environ  # the hook's (public) socket name is there: the check looks at the right thing
        for text in (environ, cmdline):
            assert "MONARCH_DEBUG_TOKEN" not in text and "TOKEN=" not in text
            assert not [s for s in secrets if s in text]
    sid = waiting.session["sid"]
    r = client.request(agent.addr, lambda port: m.DebugAttach(sid, client.addr, "tester", port, inbox.port.ref)).get(timeout=T)
    if not r["waiting"]:
        _until_waiting(inbox)
    client.send(agent.addr, m.DebugInput(sid, client.addr, b"c\n"))
    seen = _until_exited(inbox)
    assert seen[m.DebugEnded].reason == "rank 0 continued"
    assert seen[m.RunOutput] == b"after\n" and seen[m.RunExited].exit_code == 0
    assert wait_gone([child]) == []


def test_a_process_the_rank_started_may_open_a_session_too(client, agent):
    """What the agent checks is ancestry, not a secret the rank passed on: a python the rank's shell
    started (as torchrun starts its workers) pauses in breakpoint() and continues."""
    inbox = StreamInbox(client)
    _run(client, agent, inbox, ["sh", "-c", f'{sys.executable} -c "$1"; echo "done $?"', "sh",
                                "x = 4\nbreakpoint()\nprint('after', x * 2)"])
    waiting = inbox.next(m.DebugWaiting)
    assert psutil.Process(waiting.session["pid"]).parent().name() in ("sh", "dash", "bash")  # the rank's child
    sid = waiting.session["sid"]
    r = client.request(agent.addr, lambda port: m.DebugAttach(sid, client.addr, "tester", port, inbox.port.ref)).get(timeout=T)
    if not r["waiting"]:
        _until_waiting(inbox)
    client.send(agent.addr, m.DebugInput(sid, client.addr, b"p x * 3\n"))
    assert _until_waiting(inbox) == b"12\n(Pdb) "
    client.send(agent.addr, m.DebugInput(sid, client.addr, b"c\n"))
    seen = _until_exited(inbox)
    assert seen[m.DebugEnded].reason == "rank 0 continued"
    assert seen[m.RunOutput] == b"after 8\ndone 0\n" and seen[m.RunExited].exit_code == 0, seen


def test_a_process_the_agent_did_not_start_gets_no_session_even_with_a_ranks_whole_environment(client, agent):
    """Anything a rank's environment holds, any process of the user can read in /proc/PID/environ: so it
    proves nothing.  A python this test starts with a live rank's environment, to the byte, has its
    breakpoint() refused (it said why and went on) instead of pausing in a session."""
    import signal
    import subprocess

    inbox = StreamInbox(client)
    # (No `exec` in the rank: /proc/PID/environ read while a process execs can be empty.)
    _run(client, agent, inbox, [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(120)"])
    rank = int(_line(inbox))
    with open(f"/proc/{rank}/environ", "rb") as f:
        env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    assert proto.SOCK_ENV.encode() in env and env[b"PYTHONBREAKPOINT"] == b"monarch_breakpoint.set_trace"
    r = subprocess.run([sys.executable, "-c", "breakpoint(); print('went on')"], env=env, capture_output=True,
                       text=True, timeout=T)
    assert r.returncode == 0 and r.stdout == "went on\n", r.stderr
    assert "breakpoint() ignored: no debug session (the host agent refused the debug session)" in r.stderr
    assert client.request(agent.addr, lambda port: m.DebugList(port)).get(timeout=T) == []
    os.kill(rank, signal.SIGKILL)
    assert inbox.next(m.RunExited).exit_code != 0


def test_attaching_to_an_unknown_session_is_an_error(client, agent):
    fut = client.request(agent.addr, lambda port: m.DebugAttach(42, client.addr, "tester", port, m.PortRef(client.addr, 0)))
    with pytest.raises(RuntimeError, match="debug session dbghost/42 has ended"):
        fut.get(timeout=T)


def test_the_hook_without_an_agent_says_why_and_goes_on(tmp_path):
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_DEBUG")}
    env["PYTHONBREAKPOINT"] = "monarch_agents.debug_rank.set_trace"
    r = subprocess.run([sys.executable, "-c", "breakpoint(); print('went on')"], capture_output=True, text=True,
                       env=env, timeout=T)
    assert r.returncode == 0 and r.stdout == "went on\n", r.stderr
    assert "breakpoint() ignored: no debug session" in r.stderr


def test_printing_more_than_a_frame_in_pdb_keeps_the_session(client, agent):
    """pdb printing 70 MB (more than the 64 MiB a debug frame may hold) reaches the holder in pieces
    of at most 1 MiB, the session goes on (it ended, said the rank exited and let it run, before),
    and `c` then lets the rank end with 0."""
    inbox = StreamInbox(client)
    _run(client, agent, inbox, [sys.executable, "-c", "x = 5\nbreakpoint()\nprint('after', x * 2)"])
    sid = inbox.next(m.DebugWaiting).session["sid"]
    r = client.request(agent.addr, lambda port: m.DebugAttach(sid, client.addr, "tester", port, inbox.port.ref)).get(timeout=T)
    if not r["waiting"]:
        _until_waiting(inbox)
    client.send(agent.addr, m.DebugInput(sid, client.addr, b"p 'y' * 70_000_000\n"))
    total, largest = 0, 0
    while True:
        msg = inbox.next(m.DebugOutput)
        total += len(msg.data)
        largest = max(largest, len(msg.data))
        client.send(agent.addr, m.DebugAck(sid, client.addr, total))  # more than a window: the agent waits for it
        if msg.waiting:
            break
    assert total == len(b"''\n(Pdb) ") + 70_000_000 and largest <= 2 * proto.OUT_PIECE
    client.send(agent.addr, m.DebugInput(sid, client.addr, b"p x * 7\n"))
    assert _until_waiting(inbox) == b"35\n(Pdb) "
    client.send(agent.addr, m.DebugInput(sid, client.addr, b"c\n"))
    seen = _until_exited(inbox)
    assert seen[m.DebugEnded].reason == "rank 0 continued"
    assert seen[m.RunOutput] == b"after 10\n" and seen[m.RunExited].exit_code == 0

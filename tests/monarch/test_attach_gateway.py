"""``attach(addr)``: the client's traffic to a worker's procs goes through the worker loop at ``addr``
(one duplex connection), not straight to the worker's host agent.  Killing the worker loop alone
(its host agent and procs go on, in a session of their own) cuts the client off from them: a call
fails, where a client that dialled the agent directly would still get its answer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from tests.helpers import ROOT, wait_gone

PROGRAM = textwrap.dedent('''
    import os, signal, sys, time
    import monarch.actor
    from monarch._src.actor.actor_mesh import attach
    from monarch.actor import Actor, attach_to_workers, endpoint

    class Echo(Actor):
        @endpoint
        def echo(self, msg: str) -> str:
            return msg

    # The lost proc is a failure no one else handles: heard here, so that the call can say how it ended.
    monarch.actor.unhandled_fault_hook = lambda failure: None
    worker_pid, address = int(sys.argv[1]), sys.argv[2]
    attach(address)
    hosts = attach_to_workers(ca="trust_all_connections", workers=[address])
    echo = hosts.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo)
    print("before:", echo.echo.call_one("hello").get(), flush=True)
    os.kill(worker_pid, signal.SIGKILL)
    try:
        print("after:", echo.echo.call_one("hello").get(timeout=120))
    except Exception as e:
        print("after: failed", type(e).__name__)
''')


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tasks:
        try:  # a thread may end between the listing and the read
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return out


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("MONARCH_JOB", None)
    return env


def _start_worker_loop(env: dict, path: str) -> subprocess.Popen:
    """A worker loop at ``ipc://path``, in a session of its own."""
    return subprocess.Popen([sys.executable, "-c", "from monarch.actor import run_worker_loop_forever; "
                             f"run_worker_loop_forever(address='ipc://{path}', ca='trust_all_connections')"],
                            env=env, start_new_session=True)


def test_a_client_attached_through_a_worker_loses_its_procs_with_the_worker_loop(tmp_path, no_leaked_processes):
    env, path = _env(), str(tmp_path / "worker")
    worker = _start_worker_loop(env, path)
    agents: list[int] = []
    try:
        client = subprocess.Popen([sys.executable, "-c", PROGRAM, str(worker.pid), f"ipc://{path}"], env=env,
                                  cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = client.stdout.readline()
        # The worker loop's host agent (a child of it, in a session of its own) outlives its kill.
        agents = _children(worker.pid)
        out, err = client.communicate(timeout=240)
        assert first == "before: hello\n", first + out + err
        assert out == "after: failed SupervisionError\n", out + err
    finally:
        for pid in agents:
            try:
                os.killpg(pid, signal.SIGKILL)  # the agent leads its session: its procs go with it
            except OSError:
                pass
        if worker.poll() is None:
            worker.kill()
        worker.wait()
        assert wait_gone(agents) == []


SHUTDOWN = textwrap.dedent('''
    import sys, threading, time
    from monarch._src.actor.actor_mesh import attach
    from monarch.actor import Actor, attach_to_workers, endpoint, shutdown_context

    class Echo(Actor):
        @endpoint
        def echo(self, msg: str) -> str:
            return msg

    attach(sys.argv[1])
    hosts = attach_to_workers(ca="trust_all_connections", workers=[sys.argv[1]])
    print(hosts.spawn_procs(per_host={"procs": 1}).spawn("echo", Echo).echo.call_one("hello").get(), flush=True)
    gateway = lambda: sorted(t.name for t in threading.enumerate() if t.name.startswith("gateway"))
    print("while attached:", bool(gateway()))
    shutdown_context().get()
    for _ in range(600):
        if not gateway():
            break
        time.sleep(0.1)
    print("after shutdown_context:", gateway())
''')


def test_shutdown_context_ends_the_gateway(tmp_path, no_leaked_processes):
    env, path = _env(), str(tmp_path / "worker")
    worker = _start_worker_loop(env, path)
    try:
        r = subprocess.run([sys.executable, "-c", SHUTDOWN, f"ipc://{path}"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=240)
        assert r.stdout == "hello\nwhile attached: True\nafter shutdown_context: []\n", r.stdout + r.stderr
    finally:
        worker.kill()
        worker.wait()

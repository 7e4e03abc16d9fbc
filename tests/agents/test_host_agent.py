"""The host agent, spoken to in its own messages: procs, commands, shells, deaths, shutdown."""

from __future__ import annotations

import os
import queue
import signal
import uuid

import psutil
import pytest

from monarch_agents import messages as m
from monarch_agents.errors import SupervisionError
from tests.helpers import start_host_agent, wait_gone

pytestmark = pytest.mark.timeout(60)

T = 30


@pytest.fixture(scope="module")
def agent(client, tmp_path_factory):
    a = start_host_agent(client.keys, tmp_path_factory.mktemp("agent"), hostname="testhost")
    yield a
    a.stop()
    assert wait_gone([a.pid]) == []


class Streams:
    """One stream port per run or shell (as any client opens them), its messages in a queue."""

    def __init__(self, rt):
        self.rt = rt
        self.queues: dict[str, queue.Queue] = {}

    def open(self, key: str) -> m.PortRef:
        return self.rt.open_stream(self.queue(key).put).ref

    def queue(self, key: str) -> queue.Queue:
        return self.queues.setdefault(key, queue.Queue())

    def collect(self, key: str) -> tuple[dict, m.RunExited]:
        """Output per stream, and the exit, of run ``key``."""
        out = {"stdout": b"", "stderr": b""}
        q = self.queue(key)
        while True:
            msg = q.get(timeout=T)
            if isinstance(msg, m.RunExited):
                return out, msg
            if isinstance(msg, m.RunOutput):
                out[msg.stream] += msg.data
            else:
                out["stdout"] += msg.data


@pytest.fixture(scope="module")
def streams(client):
    return Streams(client)


def _spawn(rt, agent, count: int, env: dict | None = None) -> list[m.ProcInfo]:
    mesh_id = f"t-{uuid.uuid4().hex[:8]}"
    infos = rt.request(agent.addr, lambda port: m.SpawnProcs(mesh_id, count, rt.addr, port, env or {})).get(timeout=T)
    return mesh_id, infos


def _run(rt, agent, streams, argv, env=None, cwd=None, rank=0) -> str:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    rt.send(agent.addr, m.RunCommand(run_id, list(argv), env or {}, cwd, streams.open(run_id), rank, rt.addr))
    return run_id


def test_ping_answers_host_info(client, agent):
    info = client.request(agent.addr, lambda port: m.Ping(port)).get(timeout=T)
    assert isinstance(info, m.HostInfo)
    assert info.host == "testhost" and info.pid == agent.pid and info.addr == agent.addr
    assert info.ip == "127.0.0.1"


def test_spawn_and_stop_procs(client, agent):
    mesh_id, infos = _spawn(client, agent, 3)
    assert len(infos) == 3 and all(isinstance(i, m.ProcInfo) for i in infos)
    pids = [i.pid for i in infos]
    assert len(set(pids)) == 3 and all(i.host == "testhost" for i in infos)
    # Forked from the zygote, a child of the agent.
    zygotes = {psutil.Process(p).ppid() for p in pids}
    assert len(zygotes) == 1 and psutil.Process(zygotes.pop()).ppid() == agent.pid
    listed = client.request(agent.addr, lambda port: m.Ping(port)).get(timeout=T).procs
    assert {p["pid"] for p in listed if p["mesh"] == mesh_id} == set(pids)
    stopped = client.request(agent.addr, lambda port: m.StopProcs(mesh_id, port)).get(timeout=T)
    assert stopped == 3
    assert wait_gone(pids) == []


def test_no_job_secret_in_a_procs_environ_or_argv(client, agent):
    """House rule: keys never in argv or environ.  A proc agent (where every actor's code runs) gets its
    keys on its stdin: none of the job's secret keys, nor a token, is in its /proc/PID/environ or cmdline."""
    mesh_id, (info,) = _spawn(client, agent, 1)
    secrets = [v for k, v in client.keys.as_dict().items() if k.endswith("_secret") and v]
    assert len(secrets) >= 2
    for what in ("environ", "cmdline"):
        with open(f"/proc/{info.pid}/{what}", "rb") as f:
            text = f.read().decode(errors="replace")
        assert "python" in text if what == "cmdline" else "PATH=" in text  # (the check reads something)
        assert not [s for s in secrets if s in text] and "TOKEN=" not in text
    assert client.request(agent.addr, lambda port: m.StopProcs(mesh_id, port)).get(timeout=T) == 1
    assert wait_gone([info.pid]) == []


def test_owner_is_told_how_its_proc_died(client, agent):
    _, (info,) = _spawn(client, agent, 1)
    client.own(info.addr, {"what": f"proc t[0] (pid {info.pid})", "rank": 0, "host": info.host})
    died: queue.Queue = queue.Queue()
    client.watch(info.addr, died.put)
    os.kill(info.pid, signal.SIGKILL)
    err = died.get(timeout=T)
    assert isinstance(err, SupervisionError)
    assert "killed by SIGKILL" in str(err) and "testhost" in str(err)
    assert err.exit_code == -signal.SIGKILL and err.rank == 0
    client.disown(info.addr)


def test_proc_that_fails_to_start_fails_the_spawn(client, agent):
    # An invalid log level makes the new proc exit before it reports in.
    with pytest.raises(RuntimeError, match="failed to start"):
        _spawn(client, agent, 2, env={"MONARCH_LOG": "NOT-A-LEVEL"})
    # The agent is fine afterwards.
    mesh_id, infos = _spawn(client, agent, 1)
    client.request(agent.addr, lambda port: m.StopProcs(mesh_id, port)).get(timeout=T)
    assert wait_gone([i.pid for i in infos]) == []


def test_run_command_streams_output_and_exit(client, agent, streams, tmp_path):
    run_id = _run(client, agent, streams, ["sh", "-c", 'echo "out $FOO"; pwd; echo err >&2; exit 7'],
                  env={"FOO": "bar"}, cwd=str(tmp_path))
    out, exited = streams.collect(run_id)
    assert out["stdout"].decode().splitlines() == ["out bar", str(tmp_path)]
    assert out["stderr"] == b"err\n"
    assert (exited.exit_code, exited.reason) == (7, "exited with code 7")
    # The output was also kept in the agent's log, readable later.
    logs = client.request(agent.addr, lambda port: m.ReadLog(run_id, "stdout", 0, port)).get(timeout=T)
    data, done = logs[0]
    assert data.decode().startswith("out bar") and done


def test_run_ids_stay_inside_the_log_folder_and_logs_are_private(client, agent, streams, tmp_path):
    outside = tmp_path / "escaped"
    run_id = f"../../../../{outside}"  # a peer's run id that would name a folder elsewhere
    client.send(agent.addr, m.RunCommand(run_id, ["echo", "hi"], {}, None, streams.open(run_id), 0, client.addr))
    out, exited = streams.collect(run_id)
    assert out["stdout"] == b"hi\n" and exited.exit_code == 0
    assert not outside.exists()
    [run_dir] = [os.path.join(r, d) for r, ds, _ in os.walk(agent.info["log_dir"]) for d in ds if "escaped" in d]
    assert os.path.dirname(run_dir) == os.path.join(agent.info["log_dir"], "runs")
    for name in ("0.stdout", "0.stderr", "0.json", "0.exit"):
        assert oct(os.stat(os.path.join(run_dir, name)).st_mode & 0o777) == "0o600", name
    logs = client.request(agent.addr, lambda port: m.ReadLog(run_id, "stdout", 0, port)).get(timeout=T)
    assert logs[0] == (b"hi\n", True)


def test_run_missing_command(client, agent, streams):
    run_id = _run(client, agent, streams, ["/no/such/program"])
    out, exited = streams.collect(run_id)
    assert exited.exit_code == 127
    assert b"cannot run" in out["stderr"]


def test_signal_run(client, agent, streams):
    run_id = _run(client, agent, streams, ["sh", "-c", "echo started; exec sleep 60"])
    q = streams.queue(run_id)
    first = q.get(timeout=T)
    assert first.data == b"started\n"
    client.send(agent.addr, m.SignalRun(run_id, signal.SIGTERM))
    _, exited = streams.collect(run_id)
    assert exited.reason == "killed by SIGTERM" and exited.exit_code == -signal.SIGTERM


def test_shell(client, agent, streams):
    shell_id = f"sh-{uuid.uuid4().hex[:8]}"
    client.send(agent.addr, m.OpenShell(shell_id, ["sh"], {"PS1": "$ "}, None, 24, 80, streams.open(shell_id),
                                        client.addr))
    client.send(agent.addr, m.ShellData(shell_id, b"echo hello-$((6*7))\nexit 3\n"))
    out, exited = streams.collect(shell_id)
    assert b"hello-42" in out["stdout"]
    assert exited.exit_code == 3


@pytest.mark.parametrize("how", [{}, {"MONARCH_EXEC_SPAWN": "0"}], ids=["spawned", "forked"])
def test_a_spawned_command_gets_what_a_forked_one_did(client, agent, streams, tmp_path, how):
    """A plain command is spawned (posix_spawn), not forked from the zygote: found from its working
    directory as execvpe would, its argv as given, stdin from /dev/null, no descriptor but its three, its own session,
    SIGPIPE at its default (as from a shell), and the variables its spawner removed are gone."""
    script = tmp_path / "x.sh"
    script.write_text("#!/bin/sh\nls /proc/self/fd; echo sid=$(cut -d' ' -f6 /proc/$$/stat) pid=$$; echo gone=${GONE-unset}; echo argv0=$0; grep SigIgn /proc/self/status; cat\n")
    script.chmod(0o755)
    env = {"GONE": "1", "MONARCH_ENV_UNSET": "GONE", **how}
    run_id = _run(client, agent, streams, ["./x.sh"], env=env, cwd=str(tmp_path))
    out, exited = streams.collect(run_id)
    assert exited.exit_code == 0, out
    lines = out["stdout"].decode().split()
    fds = lines[:next(i for i, x in enumerate(lines) if x.startswith("sid="))]
    assert fds[:3] == ["0", "1", "2"] and len(fds) == 4, lines  # the 4th: the one ls reads /proc/self/fd with
    sid, pid = (x.split("=")[1] for x in lines if x.startswith(("sid=", "pid=")))
    assert sid == pid  # it leads its own session (killpg reaches all it starts)
    assert "gone=unset" in lines and "argv0=./x.sh" in lines  # its argv as given
    ignored = int(lines[lines.index("SigIgn:") + 1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), hex(ignored)


def test_a_spawned_command_dies_with_its_zygote(client, tmp_path, streams):
    """Killed with the zygote even when its host agent cannot do it (stopped): the parent-death signal."""
    a = start_host_agent(client.keys, tmp_path, hostname="spawned-orphan")
    try:
        (zygote,) = a.children()
        run_id = _run(client, a, streams, ["sh", "-c", "echo up; exec sleep 300"])
        assert streams.queue(run_id).get(timeout=T).data == b"up\n"
        [rank] = [c.pid for c in psutil.Process(zygote).children()]
        os.kill(a.pid, signal.SIGSTOP)
        try:
            os.kill(zygote, signal.SIGKILL)
            assert wait_gone([rank]) == []
        finally:
            os.kill(a.pid, signal.SIGCONT)
    finally:
        a.stop()
    assert wait_gone([a.pid]) == []


def test_zygote_death_stops_the_agent(client, tmp_path):
    a = start_host_agent(client.keys, tmp_path, hostname="zygote-dies")
    (zygote,) = a.children()
    os.kill(zygote, signal.SIGKILL)
    assert a.proc.wait(timeout=T) == 0
    assert wait_gone([zygote]) == []


def test_a_stopping_agents_last_answer_waits_for_a_slow_peer_to_take_it(client, tmp_path):
    """The answer to a Shutdown, to a peer the agent never wrote to before (a new link, which waits for
    the peer to accept it), arrives though the peer's IO thread is held past the close's own linger
    (0.5 s): a fan-out tree's loaded parent lost its leaves' answers so (test_fanout's shutdown test)."""
    import subprocess
    import threading

    from tests.agents.test_transport import Box

    a = start_host_agent(client.keys, tmp_path, hostname="slow-peer")
    peer = Box(client.keys, "slow-peer-client")
    held, release = threading.Event(), threading.Event()
    peer.mb.call_soon(lambda: (held.set(), release.wait(T)))  # it accepts nothing meanwhile
    try:
        assert held.wait(T)
        client.send(a.addr, m.Shutdown(m.PortRef(peer.addr, 7)))
        with pytest.raises(subprocess.TimeoutExpired):
            a.proc.wait(timeout=1.0)  # it waits for its answer to leave
        release.set()
        reply = peer.received.get(timeout=T)
        assert (type(reply), reply.port_id, reply.ok, reply.payload) == (m.Reply, 7, True, True)
        assert a.proc.wait(timeout=T) == 0
    finally:
        release.set()
        peer.close()
        a.stop()


def test_shutdown_stops_agent_and_its_procs(client, tmp_path):
    a = start_host_agent(client.keys, tmp_path, hostname="shut")
    _, infos = _spawn(client, a, 2)
    pids = [i.pid for i in infos] + a.children()
    assert client.request(a.addr, lambda port: m.Shutdown(port)).get(timeout=T) is True
    assert a.proc.wait(timeout=T) == 0
    assert wait_gone(pids) == []

"""monarch.job's Monarch job API: JobTrait's cache order, JobState, ProcessJob, LocalJob, dump/load,
a user's own JobTrait, and the bad inputs (cache of another version or kind, allocation gone).

Each scenario runs as a user's script in its own Python process and working directory: one
process talks to one job (the client's keys are the job's), as in ``tests/job/test_spmd.py``.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from monarch.errors import StateError
from monarch.job import JobState, ProcessJob, job_load
from monarch._workbench.state import STATE_FORMAT, StatePaths
from tests.cli.conftest import ROOT, monarch
from tests.helpers import wait_gone


def script(cwd, code: str, timeout: float = 120, check: bool = True, prelude: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("MONARCH_JOB", None)
    r = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def values(r: subprocess.CompletedProcess) -> dict[str, str]:
    """``key=value`` lines a script printed."""
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def agent_pids(cwd) -> list[int]:
    import json

    out = []
    for root, _, files in os.walk(os.path.join(cwd, ".monarch", "jobs")):
        if "local.json" in files:
            with open(os.path.join(root, "local.json")) as f:
                out += [a["pid"] for a in json.load(f)["agents"]]
    return out


@pytest.fixture
def cwd(tmp_path):
    yield tmp_path
    # Whatever a failed test left reserved goes (the passing ones release their jobs).
    pids = agent_pids(tmp_path)
    monarch("stop", cwd=tmp_path)
    for p in wait_gone(pids, 3):
        os.kill(p, 9)


ACTOR = """
from monarch.actor import Actor, endpoint, current_rank
class Where(Actor):
    @endpoint
    def rank(self) -> int:
        return current_rank().rank
"""


def test_process_job_meshes_by_name_and_the_cache_is_reused_by_another_process(cwd):
    r = script(cwd, prelude=ACTOR, code="""
        from monarch.job import ProcessJob
        job = ProcessJob({"trainers": 2, "dataloaders": 1})
        state = job.state()
        procs = state.trainers.spawn_procs(per_host={"gpus": 2})
        print("ranks=" + ",".join(str(v) for v in procs.spawn("w", Where).rank.call().get().values()))
        print("sizes=%d,%d" % (state.trainers.size(), state.dataloaders.size()))
        print("apply_id=" + job.apply_id)
        try:
            state.evaluators
        except AttributeError as e:
            print("error=" + str(e))
    """)
    v = values(r)
    assert v["ranks"] == "0,1,2,3" and v["sizes"] == "2,1"
    assert v["error"] == "'evaluators' is not a valid host mesh name. Available names: dataloaders, trainers"
    # monarch status sees it as a reservation of 3 local hosts.
    st = monarch("--json", "status", cwd=cwd)
    assert st.returncode == 0 and '"scheduler": "local"' in st.stdout and st.stdout.count('"agent": "up"') == 3
    # Another process with the same spec reuses it: same allocation, nothing new applied.
    r2 = script(cwd, """
        from monarch.job import ProcessJob
        job = ProcessJob({"trainers": 2, "dataloaders": 1})
        job.apply = None   # state() must not apply: the cached job can run this spec
        print("hosts=%d" % job.state().trainers.size())
        print("apply_id=" + job.apply_id)
        print("active=%s" % job.active)
    """)
    v2 = values(r2)
    assert v2 == {"hosts": "2", "apply_id": v["apply_id"], "active": "True"}
    # kill() releases it like `monarch stop`: the agents exit and the state file goes.
    pids = agent_pids(cwd)
    script(cwd, "from monarch.job import job_load\njob_load().kill()")
    assert wait_gone(pids, 5) == []
    assert not os.path.exists(cwd / ".monarch" / "job_state.pkl")


def test_monarch_serve_reservation_is_reused_by_process_job_and_monarch_run_uses_a_python_job(cwd):
    assert monarch("serve", "--hosts", "2", cwd=cwd).returncode == 0
    job_id = job_load(str(cwd / ".monarch" / "job_state.pkl")).record.job_id
    r = script(cwd, """
        from monarch.job import ProcessJob, job_load
        print("loaded=" + type(job_load()).__name__)
        job = ProcessJob({"hosts": 2})
        print("hosts=%d" % job.state().hosts.size())
        print("job_id=" + job._running.record.job_id)
    """)
    v = values(r)
    assert v == {"loaded": "ProcessJob", "hosts": "2", "job_id": job_id}
    assert monarch("stop", cwd=cwd).returncode == 0
    # And the other way: a job made from Python is what `monarch run` runs on.
    script(cwd, "from monarch.job import ProcessJob\nProcessJob({'a': 1, 'b': 1}).state()")
    run = monarch("run", "--", "sh", "-c", "echo on-$MONARCH_HOST_RANK", cwd=cwd)
    assert run.returncode == 0, run.stderr
    assert "on-0" in run.stdout and "on-1" in run.stdout


def test_a_cached_job_that_cannot_run_the_spec_is_released_and_the_user_told(cwd):
    script(cwd, "from monarch.job import ProcessJob\nProcessJob({'hosts': 1}).state()")
    old = agent_pids(cwd)
    r = script(cwd, """
        from monarch.job import ProcessJob
        print("hosts=%d" % ProcessJob({"hosts": 2}).state().hosts.size())
    """)
    assert values(r)["hosts"] == "2"
    assert "cannot run this ProcessJob: releasing it and applying anew" in r.stderr
    assert wait_gone(old, 5) == []


def test_state_when_the_cached_allocation_is_gone_makes_a_new_one_and_says_so(cwd):
    script(cwd, "from monarch.job import ProcessJob\nProcessJob({'hosts': 1}).state()")
    old_id = job_load(str(cwd / ".monarch" / "job_state.pkl")).record.job_id
    for p in agent_pids(cwd):
        os.kill(p, 9)
    r = script(cwd, """
        from monarch.job import ProcessJob
        job = ProcessJob({"hosts": 1})
        print("hosts=%d" % job.state().hosts.size())
        print("job_id=" + job._running.record.job_id)
    """)
    v = values(r)
    assert v["hosts"] == "1" and v["job_id"] != old_id
    assert f"the cached reservation {old_id} is gone" in r.stderr


def test_a_cache_file_of_another_version_or_program_is_a_clear_error_and_left_alone(cwd):
    path = cwd / ".monarch" / "job_state.pkl"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps({"format": STATE_FORMAT, "version": 99, "state": {}}))
    r = script(cwd, "from monarch.job import ProcessJob\nProcessJob({'hosts': 1}).state()", check=False)
    assert r.returncode == 1
    assert "StateError: state file .monarch/job_state.pkl is version 99, this monarch reads 1" in r.stderr
    assert path.read_bytes() == pickle.dumps({"format": STATE_FORMAT, "version": 99, "state": {}})
    # PyTorch Monarch's own cache (a pickle of its job classes) is another program's file.
    path.write_bytes(_pickle_of_a_class_from("monarch._src.job.process", "ProcessJob"))
    with pytest.raises(StateError, match=r"is not a monarch state file"):  # (our monarch._src aliases may load it)
        job_load(str(path))
    path.write_bytes(b"not a pickle")
    with pytest.raises(StateError, match="is corrupt"):
        job_load(str(path))
    with pytest.raises(FileNotFoundError):
        job_load(str(cwd / "nothing.pkl"))


def _pickle_of_a_class_from(module: str, name: str) -> bytes:
    import types

    mod = types.ModuleType(module)
    cls = type(name, (), {"__module__": module})
    setattr(mod, name, cls)
    sys.modules[module] = mod
    try:
        return pickle.dumps(cls())
    finally:
        del sys.modules[module]


USER_JOB = """
import os
from monarch.actor import this_host
from monarch.job import JobState, JobTrait

class CountingJob(JobTrait):
    '''A user's own job class: its hosts are this machine; it counts what it is asked to do.'''
    def __init__(self, names):
        super().__init__()
        self.names = list(names)
    def _create(self, client_script):
        with open("created", "a") as f:
            f.write("x")
    def _state(self):
        return JobState({n: this_host() for n in self.names})
    def can_run(self, spec):
        return isinstance(spec, CountingJob) and spec.names == self.names and os.path.exists("alive")
    def _kill(self):
        with open("killed", "a") as f:
            f.write("x")
"""


def test_a_users_own_job_class_follows_monarchs_cache_order(cwd):
    (cwd / "userjob.py").write_text(USER_JOB)
    (cwd / "alive").write_text("")
    code = """
        from userjob import CountingJob
        job = CountingJob(["a", "b"])
        state = job.state()
        print("meshes=" + ",".join(sorted(state._hosts)))
        print("apply_id=" + job.apply_id)
    """
    first = values(script(cwd, code))
    second = values(script(cwd, code))
    assert (cwd / "created").read_text() == "x"          # the second process reused the cache
    assert first == second and first["meshes"] == "a,b"
    (cwd / "alive").unlink()                              # can_run is now False: kill, re-apply, re-cache
    third = values(script(cwd, code))
    assert (cwd / "created").read_text() == "xx" and (cwd / "killed").read_text() == "x"
    assert third["apply_id"] != first["apply_id"]
    # dumps/job_loads keep the running job and its apply_id.
    r = script(cwd, """
        from monarch.job import job_load, job_loads
        job = job_load()
        again = job_loads(job.dumps())
        print("same=%s" % (again.apply_id == job.apply_id and again.active))
        print("kind=" + type(again).__name__)
    """)
    assert values(r) == {"same": "True", "kind": "CountingJob"}
    # `monarch status` on it: one line, not a traceback.
    st = monarch("status", cwd=cwd)
    assert st.returncode == 3 and "holds a CountingJob job with no monarch reservation" in st.stderr


def test_local_job_and_current_job(cwd):
    (cwd / "jobs_here.py").write_text("from monarch.job import LocalJob\njob = LocalJob(('trainers', 'evals'))\n")
    r = script(cwd, prelude=ACTOR, code="""
        from monarch.job import load_current_job, set_current_job
        set_current_job("jobs_here.job")
        job = load_current_job()
        state = job.state(cached_path=None)
        print("kind=" + type(job).__name__)
        print("same=%s" % (state.trainers.hosts == state.evals.hosts))
        print("rank=%d" % state.trainers.spawn_procs().spawn("w", Where).rank.call_one().get())
    """)
    assert values(r) == {"kind": "LocalJob", "same": "True", "rank": "0"}
    bad = script(cwd, "from monarch.job import load_current_job\nimport os\nos.remove('.monarch/specs/default')\n"
                      "load_current_job()", check=False)
    assert bad.returncode == 1 and "FileNotFoundError: No spec found at .monarch/specs/default" in bad.stderr


def test_an_uncached_job_is_released_when_the_process_exits(cwd):
    r = script(cwd, """
        import json, os
        from monarch.job import ProcessJob
        job = ProcessJob({"hosts": 2})
        job.state(cached_path=None)
        print("path=" + job.path)
    """)
    path = values(r)["path"]
    # The release ran whole (a ThreadPoolExecutor in it once refused work at interpreter exit).
    assert "releasing an uncached job at exit failed" not in r.stderr, r.stderr
    assert not os.path.exists(path)                       # released at exit, state file gone
    assert not os.path.exists(cwd / ".monarch" / "job_state.pkl")
    pids = agent_pids(cwd)
    assert wait_gone(pids, 5) == []


@pytest.mark.parametrize("meshes, match", [
    ({"hosts": 0}, "needs a positive number of hosts"),
    ({"hosts": "2"}, "needs a positive number of hosts"),
    ({}, "takes a dict of mesh name"),
    ("hosts", "takes a dict of mesh name"),
    ({"my hosts": 1}, "must be a Python identifier"),
])
def test_process_job_bad_meshes(meshes, match):
    with pytest.raises(ValueError, match=match):
        ProcessJob(meshes)


def test_job_state_is_monarchs():
    state = JobState({"b": 1, "a": 2})
    assert (state.a, state.b) == (2, 1)
    with pytest.raises(AttributeError, match="^'c' is not a valid host mesh name. Available names: a, b$"):
        state.c  # noqa: B018  (the attribute access is what raises)
    assert pickle.loads(pickle.dumps(state)).a == 2
    assert StatePaths  # the state file paths stay importable from monarch._workbench.state


def test_shell_exec_command_and_port_forward_bad_input(cwd):
    r = script(cwd, """
        import socket, time
        from monarch.actor import this_proc
        from monarch.job import PortForwarder, ProcessJob, exec_command, shell

        def free():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]

        hosts = ProcessJob({"hosts": 2}).state(cached_path=None).hosts
        try:
            shell(hosts)
        except ValueError as e:
            print("shell=" + str(e))
        print("rc=%d" % exec_command(hosts, ["sh", "-c", "exit $MONARCH_RANK_hosts"]).get())
        print("rc_missing=%d" % exec_command(hosts, ["no-such-command"], output_dir="out/$SUBDIR").get())
        procs = hosts.slice(hosts=1).spawn_procs()
        fwd = this_proc().spawn("fwd", PortForwarder)
        dead = free()
        t = time.monotonic()
        try:
            fwd.forward.call_one(procs, dead, this_proc(), f"127.0.0.1:{free()}", wait=1).get()
        except Exception as e:
            print("fwd_error=" + ("nothing listens on 127.0.0.1:%d on host host1 (waited 1 s)" % dead in str(e)).__str__())
        print("bounded=%s" % (time.monotonic() - t < 10))
        src = free()
        fwd.forward.call_one(procs, dead, this_proc(), f"127.0.0.1:{src}", connect_timeout=1).get()
        t = time.monotonic()
        with socket.create_connection(("127.0.0.1", src)) as s:
            s.settimeout(20)
            try:
                got = s.recv(1)
            except ConnectionResetError:
                got = b""
        print("closed=%s" % (got == b"" and time.monotonic() - t < 10))
        fwd.stop().get()
    """)
    v = values(r)
    assert v["shell"] == "shell requires a singleton HostMesh; slice the mesh to one host first"
    assert v["rc"] == "1" and v["rc_missing"] == "127"
    assert "no-such-command: command not found" in (cwd / "out" / "hosts_1" / "stderr.txt").read_text()
    assert v["fwd_error"] == "True" and v["bounded"] == "True" and v["closed"] == "True"


def test_shell_on_one_host_returns_its_exit_status(cwd):
    env = {**os.environ, "PYTHONPATH": ROOT}
    code = ("import sys\nfrom monarch.job import ProcessJob, shell\n"
            "hosts = ProcessJob({'hosts': 2}).state(cached_path=None).hosts\n"
            "sys.exit(shell(hosts.slice(hosts=1), env={'GREETING': 'hi'}))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, input="echo $GREETING-$MONARCH_HOST_RANK\nexit 7\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 7, r.stderr
    assert "hi-1" in r.stdout


def test_remote_mount_and_gather_mount_are_applied_at_every_state(cwd):
    from monarch_rdmafs.mount import fuse_unavailable_reason

    why = fuse_unavailable_reason()
    if why:
        pytest.skip(f"FUSE cannot be used here: {why}")
    (cwd / "project").mkdir()
    (cwd / "project" / "model.py").write_text("V = 1\n")
    r = script(cwd, """
        import os
        from monarch.job import ProcessJob
        job = ProcessJob({"trainers": 2})
        job.remote_mount("project", mntpoint=os.path.abspath("mnt/$SUBDIR"))
        job.gather_mount(os.path.abspath("mnt/$SUBDIR"), os.path.abspath("seen"))
        job.state(cached_path=None)
        print("first=" + ",".join(open(f"seen/hosts_{i}/model.py").read().strip() for i in range(2)))
        open("project/model.py", "w").write("V = 2\\n")
        job.state(cached_path=None)
        print("second=" + ",".join(open(f"mnt/hosts_{i}/model.py").read().strip() for i in range(2)))
        job.close_mounts()
        print("mounted=" + str(any(os.path.ismount(p) for p in ("seen", "mnt/hosts_0", "mnt/hosts_1"))))
    """)
    v = values(r)
    assert v["first"] == "V = 1,V = 1" and v["second"] == "V = 2,V = 2" and v["mounted"] == "False"
    assert wait_gone(agent_pids(cwd), 5) == []

"""submitit's cluster="monarch" on a real local reservation: user scripts import only submitit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

BIN = os.path.dirname(sys.executable)

pytest.importorskip("submitit")


def monarch(*args: str, cwd, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([os.path.join(BIN, "monarch"), *args], cwd=str(cwd), capture_output=True, text=True,
                       timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"monarch {' '.join(args)}: {r.returncode}\n{r.stderr}")
    return r


def script(tmp_path, body: str, timeout: float = 180) -> subprocess.CompletedProcess:
    path = tmp_path / "user.py"
    path.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(path)], cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def reservation(tmp_path):
    monarch("serve", "--hosts", "2", "--procs-per-host", "2", cwd=tmp_path)
    yield tmp_path
    monarch("stop", cwd=tmp_path, check=False)
    # no task launcher or submitit task of this reservation is left behind
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in "\n".join(line for line in ps.splitlines() if "_submitit_task" in line or "_submit" in line)


def test_submit_result_environment_array_errors_and_cancel(reservation):
    r = script(reservation, '''
        import json, os, time, submitit

        def where(x):
            env = submitit.JobEnvironment()
            return {"x": x, "rank": env.global_rank, "local": env.local_rank, "tasks": env.num_tasks,
                    "nodes": env.num_nodes, "node": env.node, "host": env.hostname, "job": env.job_id,
                    "hosts": list(env.hostnames)}

        def boom():
            raise ValueError("remote boom")

        def span(i):
            t0 = time.time(); time.sleep(0.3); return (t0, time.time())

        out = {}
        ex = submitit.AutoExecutor(folder="logs", cluster="monarch")
        ex.update_parameters(nodes=2, tasks_per_node=2, timeout_min=5)
        job = ex.submit(where, 7)
        out["results"] = job.results()
        out["state"] = job.state
        out["stdout_file"] = os.path.exists(job.paths.stdout)
        ex.update_parameters(nodes=1, tasks_per_node=1)
        try:
            ex.submit(boom).result()
        except Exception as e:
            out["boom"] = f"{type(e).__name__}: {e}"
        jobs = ex.map_array(span, range(8))
        spans = [j.result() for j in jobs]
        out["max_parallel"] = max(sum(1 for s in spans if s[0] <= t < s[1]) for t, _ in spans)
        with ex.batch():
            b = [ex.submit(where, i) for i in range(3)]
        out["batch"] = sorted(j.result()["x"] for j in b)
        slow = ex.submit(time.sleep, 120)
        while slow.state != "RUNNING":
            time.sleep(0.05)
        time.sleep(1)
        slow.cancel()
        slow.wait()
        out["cancel"] = slow.state
        print(json.dumps(out))
    ''')
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    res = sorted(out["results"], key=lambda d: d["rank"])
    assert [d["rank"] for d in res] == [0, 1, 2, 3] and [d["local"] for d in res] == [0, 1, 0, 1]
    assert {d["tasks"] for d in res} == {4} and {d["nodes"] for d in res} == {2}
    assert [d["node"] for d in res] == [0, 0, 1, 1]
    assert {d["host"] for d in res} == {"host0", "host1"} and res[0]["hosts"] == ["host0", "host1"]
    assert out["state"] == "COMPLETED" and out["stdout_file"]
    assert "FailedJobError" in out["boom"] and "remote boom" in out["boom"] and "Traceback" in out["boom"]
    assert out["max_parallel"] <= 4  # 2 hosts x 2 procs: never more at once
    assert out["batch"] == [0, 1, 2]
    assert out["cancel"] == "CANCELLED"


def test_signal_timeout_requeue_and_stopped_reservation(reservation):
    r = script(reservation, '''
        import json, os, signal, subprocess, sys, time, submitit

        class Counter(submitit.helpers.Checkpointable):
            def __init__(self):
                self.runs = 0
            def __call__(self):
                self.runs += 1
                if self.runs == 1:
                    time.sleep(60)  # the first run times out: checkpoint, requeue
                return self.runs

        def die():
            os.kill(os.getpid(), signal.SIGKILL)

        out = {}
        ex = submitit.AutoExecutor(folder="logs", cluster="monarch")
        try:
            ex.submit(die).result()
        except Exception as e:
            out["killed"] = str(e).splitlines()[0]
        from monarch.job.submitit import MonarchExecutor
        mx = MonarchExecutor(folder="logs")
        mx.update_parameters(timeout_min=0.2, signal_delay_s=4)  # SIGUSR2 after 8 s: the handler is in by then
        out["requeued"] = mx.submit(Counter()).result()
        never = mx.submit(time.sleep, 60)
        try:
            never.result()
        except Exception as e:
            out["timeout"] = never.state
        ex.update_parameters(nodes=3)
        try:
            ex.submit(print, 1)
        except ValueError as e:
            out["too_small"] = str(e)
        ex.update_parameters(nodes=1, timeout_min=5)
        long = ex.submit(time.sleep, 120)
        while long.state != "RUNNING":
            time.sleep(0.05)
        time.sleep(1)
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "monarch"), "stop"], check=True, capture_output=True)
        long.wait()
        out["stopped"] = [long.state, long.get_info()["reason"]]
        print(json.dumps(out))
    ''')
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "SIGKILL" in out["killed"] and "host" in out["killed"], out["killed"]
    assert out["requeued"] == 2  # checkpointed at the timeout signal, requeued, finished
    assert out["timeout"] == "TIMEOUT"
    assert "too small" in out["too_small"] and "monarch serve" in out["too_small"]
    assert out["stopped"][0] == "FAILED" and "reservation was released" in out["stopped"][1], out["stopped"]


def test_no_reservation_and_unpicklable(tmp_path):
    r = script(tmp_path, '''
        import submitit, threading
        try:
            submitit.AutoExecutor(folder="logs", cluster="monarch")
        except Exception as e:
            print("ERR", type(e).__name__, e)
    ''')
    assert "ERR StateError" in r.stdout and "monarch serve" in r.stdout, r.stdout + r.stderr
    monarch("serve", "--hosts", "1", cwd=tmp_path)
    try:
        r = script(tmp_path, '''
            import submitit, threading
            lock = threading.Lock()
            ex = submitit.AutoExecutor(folder="logs", cluster="monarch")
            try:
                ex.submit(lambda: lock)
            except Exception as e:
                print("ERR", type(e).__name__, e)
        ''')
        assert "ERR TypeError" in r.stdout and "pickle" in r.stdout, r.stdout + r.stderr
    finally:
        monarch("stop", cwd=tmp_path)

"""Unit tests of the Slurm scheduler without a cluster: parsers, the state table, the sbatch
script ``dryrun`` writes, and the error paths of allocate/describe/release/logs against fake
``sbatch``/``squeue``/``sacct``/``scancel`` commands on PATH."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from monarch.errors import SchedulerError, UsageError
from monarch._workbench.state import JobSpec
from monarch_schedulers import HostState, create_scheduler
from monarch_schedulers.agent_launch import project_root
from monarch_schedulers.slurm import (
    STATES,
    SlurmScheduler,
    describe_native,
    expand_nodelist,
    parse_job_id,
    parse_time,
)

JOB_DIR = "/shared/work/.monarch/jobs/default"


# -- time ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,seconds", [
    ("UNLIMITED", None), ("NOT_SET", None), ("INVALID", None), ("INFINITE", None), ("", None),
    ("0:59", 59.0), ("1:00", 60.0), ("10:00", 600.0), ("59:59", 3599.0),
    ("1:00:00", 3600.0), ("12:34:56", 45296.0),
    ("1-00:00:00", 86400.0), ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5.0),
    ("5", 300.0), ("1-2", 86400 + 7200.0), ("1-2:30", 86400 + 9000.0), (" 0:05 ", 5.0),
])
def test_parse_time(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize("bad", ["abc", "1:2:3:4", "1-", "-1", "1:xx", "1-2:3:4:5", "1.5"])
def test_parse_time_rejects(bad):
    with pytest.raises(ValueError):
        parse_time(bad)


# -- nodelists ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text,nodes", [
    ("n1", ["n1"]),
    ("n[1-4]", ["n1", "n2", "n3", "n4"]),
    ("n[1,3-4]", ["n1", "n3", "n4"]),
    ("a1,b2", ["a1", "b2"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
    ("n[1-2],login,x[7]", ["n1", "n2", "login", "x7"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("node-[001-002]-ib", ["node-001-ib", "node-002-ib"]),
    ("", []),
])
def test_expand_nodelist(text, nodes):
    assert expand_nodelist(text) == nodes


@pytest.mark.parametrize("bad", ["n[1-", "n1]", "n[a-b]", "n[4-1]"])
def test_expand_nodelist_rejects(bad):
    with pytest.raises(ValueError):
        expand_nodelist(bad)


# -- job ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize("out,job_id", [("1234\n", "1234"), ("1234;cluster\n", "1234"), ("  77 ", "77"),
                                        ("sbatch: warning: something\n42\n", "42")])
def test_parse_job_id(out, job_id):
    assert parse_job_id(out) == job_id


def test_parse_job_id_rejects_garbage():
    with pytest.raises(SchedulerError, match="no job id"):
        parse_job_id("Submitted batch job\n")


# -- states -------------------------------------------------------------------------------------


@pytest.mark.parametrize("native,state", [
    ("PENDING", HostState.PENDING), ("CONFIGURING", HostState.PENDING),
    ("RUNNING", HostState.RUNNING), ("COMPLETING", HostState.ENDED),
    ("COMPLETED", HostState.ENDED),
    ("CANCELLED", HostState.FAILED), ("TIMEOUT", HostState.FAILED), ("NODE_FAIL", HostState.FAILED),
    ("FAILED", HostState.FAILED), ("PREEMPTED", HostState.FAILED), ("OUT_OF_MEMORY", HostState.FAILED),
    ("BOOT_FAIL", HostState.FAILED), ("DEADLINE", HostState.FAILED),
    ("WEIRD_NEW_STATE", HostState.UNKNOWN),
])
def test_state_table(native, state):
    d = describe_native("7", native)
    assert d.state is state and d.native_state == native and d.job_id == "7"
    if state is HostState.FAILED:
        assert d.reason  # every failure says why


def test_failure_reasons_read_well():
    assert describe_native("1", "CANCELLED").reason == "cancelled (scancel or admin)"
    assert describe_native("1", "TIMEOUT").reason == "hit its time limit"
    assert "node" in describe_native("1", "NODE_FAIL").reason
    assert "memory" in describe_native("1", "OUT_OF_MEMORY").reason
    assert "WEIRD" in describe_native("1", "WEIRD").reason


def test_every_table_entry_is_consistent():
    for native, (state, reason) in STATES.items():
        assert native == native.upper()
        if state in (HostState.FAILED, HostState.ENDED):
            assert reason, native


def test_sacct_spellings():
    d = describe_native("3", "CANCELLED by 0")
    assert d.state is HostState.FAILED and d.native_state == "CANCELLED"
    assert describe_native("3", "CANCELLED+").native_state == "CANCELLED"


def test_squeue_fields_running():
    d = describe_native("9", "RUNNING", "None", "9:59", "n[1-4]")
    assert d.state is HostState.RUNNING and d.reason == ""
    assert d.time_left_s == 599.0 and d.nodes == ["n1", "n2", "n3", "n4"]


def test_squeue_fields_pending_reason_in_words():
    d = describe_native("9", "PENDING", "Resources", "1:00:00", "")
    assert d.state is HostState.PENDING and d.nodes == []
    assert d.reason.startswith("Resources") and "free nodes" in d.reason
    d = describe_native("9", "PENDING", "SomethingNew", "UNLIMITED", "(Resources)")
    assert d.reason == "SomethingNew" and d.time_left_s is None and d.nodes == []


def test_failure_reason_adds_slurms_reason_where_it_tells_more():
    assert describe_native("1", "FAILED", "NonZeroExitCode").reason.endswith("(NonZeroExitCode)")
    assert describe_native("1", "NODE_FAIL", "NodeDown").reason == "a node failed (NodeDown)"
    assert describe_native("1", "TIMEOUT", "TimeLimit").reason == "hit its time limit"
    assert describe_native("1", "CANCELLED", "None").reason == "cancelled (scancel or admin)"


def test_time_left_only_while_alive():
    assert describe_native("9", "COMPLETED", "None", "1:00", "n1").time_left_s is None


def test_running_past_its_time_limit():
    # What squeue printed between a 1-minute job's limit and Slurm's next time check (seen here).
    d = describe_native("9", "RUNNING", "None", "INVALID", "n1")
    assert d.state is HostState.RUNNING and d.time_left_s == 0.0
    assert d.reason == "past its time limit: Slurm is about to end it"
    assert describe_native("9", "RUNNING", "None", "UNLIMITED", "n1").time_left_s is None


def test_completing_says_why_it_ends():
    # Never reused or waited for: its hosts are on their way out.
    d = describe_native("9", "COMPLETING", "TimeLimit", "INVALID", "n1")
    assert not d.state.alive and d.reason == "ending: hit its time limit" and d.time_left_s is None
    d = describe_native("9", "COMPLETING", "None", "9:00", "n1")
    assert d.state is HostState.ENDED and d.reason == "ending (Slurm is cleaning up its nodes)"


# -- dryrun: the sbatch script ------------------------------------------------------------------


def _script(options=None, hosts=4, job_dir=JOB_DIR, **kw):
    return SlurmScheduler(**kw).dryrun(JobSpec("slurm", hosts, 1, options or {}), job_dir)


def test_dryrun_script():
    req = _script({"partition": "debug", "time": "10:00", "client_host": "10.0.0.5"})
    assert req.scheduler == "slurm" and req.hosts == 4 and req.job_dir == JOB_DIR
    py = sys.executable
    assert req.text == f"""#!/bin/bash
#SBATCH --job-name=monarch-default
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --output={JOB_DIR}/logs/slurm-%j.out
#SBATCH --partition=debug
#SBATCH --time=10:00
#
# Written by monarch (monarch_schedulers/slurm.py). One host agent per node; each writes its
# address to {JOB_DIR}/agents/<node id>.json. `monarch stop` (scancel) ends the job.
set -eu
umask 077  # what the agents and srun's --output make is private (keys, logs, chunks)
export PYTHONPATH={project_root()}${{PYTHONPATH:+:$PYTHONPATH}}
# Each agent gets every CPU the job holds on its node (a step's default is one per task).
cpus=$(tr ',' '\\n' <<<"$SLURM_JOB_CPUS_PER_NODE" | sed 's/(.*//' | sort -n | head -n1)
srun --nodes=4 --ntasks=4 --ntasks-per-node=1 --cpus-per-task="$cpus" \\
    --output={JOB_DIR}/logs/host%n/agent.log \\
    bash -c 'exec {py} -m monarch_agents.host_agent --keys-file {JOB_DIR}/keys.json --host-rank "$SLURM_NODEID" \
--hostname "$SLURMD_NODENAME" --client-host 10.0.0.5 --agent-file "{JOB_DIR}/agents/$SLURM_NODEID.json" \
--log-dir "{JOB_DIR}/logs/host$SLURM_NODEID"'
"""


def test_dryrun_all_options():
    text = _script({"partition": "gpu", "time": "2-00:00:00", "account": "proj1", "qos": "high",
                    "gpus_per_node": 8, "constraint": "a100&ib", "exclusive": True,
                    "sbatch_args": ["--mem=64G", "--comment", "two words", "--reservation=r1"],
                    "bind": "10.1.2.3"}, hosts=2).text
    sbatch = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert sbatch == [
        "#SBATCH --job-name=monarch-default", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={JOB_DIR}/logs/slurm-%j.out",
        "#SBATCH --partition=gpu", "#SBATCH --time=2-00:00:00", "#SBATCH --account=proj1", "#SBATCH --qos=high",
        "#SBATCH --gpus-per-node=8", '#SBATCH --constraint="a100&ib"', "#SBATCH --exclusive",
        "#SBATCH --mem=64G", '#SBATCH --comment "two words"', "#SBATCH --reservation=r1",
    ]
    assert " --bind 10.1.2.3 " in text
    assert "srun --nodes=2 --ntasks=2 " in text


def test_dryrun_name_from_job_dir_and_no_options():
    text = _script(hosts=1, job_dir="/x/.monarch/jobs/train-7").text
    assert "#SBATCH --job-name=monarch-train-7\n" in text and "#SBATCH --nodes=1\n" in text
    assert "--partition" not in text and "--time" not in text and "--exclusive" not in text


def test_dryrun_quotes_odd_paths():
    odd = "/tmp/a b$HOME/.monarch/jobs/default"
    text = _script(job_dir=odd).text
    assert '#SBATCH --output="/tmp/a b$HOME/.monarch/jobs/default/logs/slurm-%j.out"' in text
    # In the shell, the literal $HOME stays literal but the node's variables expand.
    assert '--agent-file "/tmp/a b\\$HOME/.monarch/jobs/default/agents/$SLURM_NODEID.json"' in text
    assert '--output="/tmp/a b\\$HOME/.monarch/jobs/default/logs/host%n/agent.log"' in text


def test_dryrun_default_client_host(monkeypatch):
    import monarch_schedulers.slurm as slurm

    monkeypatch.setattr(slurm, "default_client_host", lambda: "192.0.2.1")
    assert "--client-host 192.0.2.1 " in _script().text
    assert "--client-host 10.9.9.9 " in _script(client_host="10.9.9.9").text
    assert "--client-host 10.8.8.8 " in _script({"client_host": "10.8.8.8"}, client_host="10.9.9.9").text


def test_dryrun_python_is_this_interpreter():
    assert f"exec {sys.executable} -m monarch_agents.host_agent" in _script().text
    assert "exec /opt/py/bin/python -m monarch_agents.host_agent" in _script(python="/opt/py/bin/python").text


@pytest.mark.parametrize("options,match", [
    ({"partiton": "debug"}, "unknown Slurm option"),
    ({"time": "soon"}, "bad Slurm time limit"),
    ({"gpus_per_node": True}, "bad gpus_per_node"),
    ({"sbatch_args": "--mem=1G"}, "sbatch_args must be a list"),
])
def test_dryrun_rejects_bad_options(options, match):
    with pytest.raises(UsageError, match=match):
        _script(options)


def test_dryrun_rejects_zero_hosts():
    with pytest.raises(UsageError):
        _script(hosts=0)


def test_create_scheduler_by_name():
    s = create_scheduler("slurm")
    assert isinstance(s, SlurmScheduler) and s.name == "slurm"


# -- fake Slurm commands ------------------------------------------------------------------------

_FAKE = """#!/bin/sh
echo "$0 $*" >> "$FAKE_SLURM_LOG"
printf '%s' "${FAKE_NAME_OUT:-}"
printf '%s' "${FAKE_NAME_ERR:-}" >&2
exit "${FAKE_NAME_RC:-0}"
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch/squeue/sacct/scancel that print FAKE_<CMD>_OUT/ERR and exit FAKE_<CMD>_RC; calls logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for cmd in ("sbatch", "squeue", "sacct", "scancel"):
        p = bin_dir / cmd
        p.write_text(_FAKE.replace("NAME", cmd.upper()))
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.log"
    log.write_text("")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_SLURM_LOG", str(log))

    def calls() -> list[str]:
        return [os.path.basename(line.split()[0]) + " " + " ".join(line.split()[1:])
                for line in log.read_text().splitlines()]

    def set_(cmd: str, out: str = "", err: str = "", rc: int = 0) -> None:
        monkeypatch.setenv(f"FAKE_{cmd.upper()}_OUT", out)
        monkeypatch.setenv(f"FAKE_{cmd.upper()}_ERR", err)
        monkeypatch.setenv(f"FAKE_{cmd.upper()}_RC", str(rc))

    set_.calls = calls  # type: ignore[attr-defined]
    return set_


def test_allocate_submits_the_script(fake_slurm, tmp_path):
    fake_slurm("sbatch", out="4242;monarch\n")
    job_dir = str(tmp_path / ".monarch" / "jobs" / "default")
    s = SlurmScheduler()
    req = s.dryrun(JobSpec("slurm", 2, 1, {}), job_dir)
    assert s.allocate(req) == "4242"
    script = os.path.join(job_dir, "slurm.sbatch")
    assert open(script).read() == req.text
    assert fake_slurm.calls() == [f"sbatch --parsable {script}"]
    for d in ("agents", "logs/host0", "logs/host1"):
        assert os.path.isdir(os.path.join(job_dir, d)), d


def test_allocate_refused_is_one_readable_line(fake_slurm, tmp_path):
    fake_slurm("sbatch", err="sbatch: error: invalid partition specified: nope\n"
                             "sbatch: error: Batch job submission failed: Invalid partition name specified\n", rc=1)
    s = SlurmScheduler()
    req = s.dryrun(JobSpec("slurm", 2, 1, {"partition": "nope"}), str(tmp_path / "j"))
    with pytest.raises(SchedulerError) as e:
        s.allocate(req)
    assert e.value.message == ("sbatch refused the job: invalid partition specified: nope; "
                               "Batch job submission failed: Invalid partition name specified")
    assert "sinfo" in e.value.hint


def test_allocate_without_a_cluster_says_so(fake_slurm, tmp_path):
    fake_slurm("sbatch", err="sbatch: error: _establish_config_source: failed to fetch config\n"
                             "sbatch: fatal: Could not establish a configuration source\n", rc=1)
    s = SlurmScheduler()
    with pytest.raises(SchedulerError, match="Could not establish a configuration source") as e:
        s.allocate(s.dryrun(JobSpec("slurm", 1, 1, {}), str(tmp_path / "j")))
    assert "SLURM_CONF" in e.value.hint


def test_missing_slurm_commands(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    s = SlurmScheduler()
    with pytest.raises(SchedulerError, match="sbatch not found") as e:
        s.allocate(s.dryrun(JobSpec("slurm", 1, 1, {}), str(tmp_path / "j")))
    assert "login node" in e.value.hint
    with pytest.raises(SchedulerError, match="squeue not found"):
        s.describe("1")


def test_describe_running(fake_slurm):
    fake_slurm("squeue", out="RUNNING|None|1-02:03:04|n[1,3-4]\n")
    d = SlurmScheduler().describe("12")
    assert d.state is HostState.RUNNING and d.nodes == ["n1", "n3", "n4"]
    assert d.time_left_s == 86400 + 2 * 3600 + 3 * 60 + 4
    assert fake_slurm.calls() == ["squeue -h -t all -j 12 -o %T|%r|%L|%N"]


def test_describe_job_left_queue_and_no_accounting(fake_slurm):
    fake_slurm("squeue", err="slurm_load_jobs error: Invalid job id specified\n", rc=1)
    fake_slurm("sacct", err="Slurm accounting storage is disabled\n", rc=1)
    d = SlurmScheduler().describe("12")
    assert d.state is HostState.ENDED and d.reason == "job left the queue" and not d.state.alive
    assert [c.split()[0] for c in fake_slurm.calls()] == ["squeue", "sacct"]
    assert fake_slurm.calls()[1] == "sacct -X -n -P -j 12 -o State,ExitCode"


def test_describe_empty_squeue_falls_back_to_sacct(fake_slurm):
    fake_slurm("squeue", out="")
    fake_slurm("sacct", out="FAILED|1:0\n")
    d = SlurmScheduler().describe("12")
    assert d.state is HostState.FAILED and d.native_state == "FAILED" and "exit code 1:0" in d.reason
    fake_slurm("sacct", out="TIMEOUT|0:0\n")
    assert SlurmScheduler().describe("12").reason == "hit its time limit"


def test_describe_controller_down_is_an_error(fake_slurm):
    fake_slurm("squeue", err="slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n", rc=1)
    with pytest.raises(SchedulerError, match="Unable to contact slurm controller") as e:
        SlurmScheduler().describe("12")
    assert "sinfo" in e.value.hint


def test_release_is_idempotent(fake_slurm):
    fake_slurm("scancel", err="scancel: error: Kill job error on job id 12: Invalid job id specified\n", rc=1)
    fake_slurm("squeue", err="slurm_load_jobs error: Invalid job id specified\n", rc=1)
    SlurmScheduler().release("12")
    assert fake_slurm.calls() == ["scancel 12", "squeue -h -j 12 -o %T"]


def test_release_waits_until_the_job_left(fake_slurm, tmp_path, monkeypatch):
    # squeue lists the job (COMPLETING) twice, then not any more.
    counter = tmp_path / "n"
    counter.write_text("0\n")
    squeue = tmp_path / "bin" / "squeue"
    squeue.write_text(f"""#!/bin/sh
read n < {counter}; n=$((n + 1)); echo $n > {counter}
[ $n -le 2 ] && echo COMPLETING
exit 0
""")
    SlurmScheduler().release("12")
    assert counter.read_text() == "3\n"


def test_release_reports_a_real_failure(fake_slurm):
    fake_slurm("scancel", err="scancel: error: Unable to contact slurm controller (connect failure)\n", rc=1)
    with pytest.raises(SchedulerError, match="scancel 12 failed: Unable to contact slurm controller"):
        SlurmScheduler().release("12")


def test_logs(tmp_path):
    job_dir = tmp_path / "j"
    (job_dir / "logs" / "host0").mkdir(parents=True)
    (job_dir / "logs" / "host10").mkdir()
    (job_dir / "logs" / "host2").mkdir()
    (job_dir / "logs" / "slurm-5.out").write_text("batch says hi\n")
    (job_dir / "logs" / "host0" / "agent.log").write_text("agent 0\n")
    (job_dir / "logs" / "host2" / "agent.log").write_text("agent 2\n")
    (job_dir / "logs" / "host10" / "agent.log").write_text("agent 10\n")
    s = SlurmScheduler()
    text = s.logs("5", job_dir=str(job_dir))
    assert text == ("== slurm-5.out ==\nbatch says hi\n\n== host0 ==\nagent 0\n\n"
                    "== host2 ==\nagent 2\n\n== host10 ==\nagent 10\n")
    assert s.logs("5", host=2, job_dir=str(job_dir)) == "== host2 ==\nagent 2\n"
    # A capped agent.log rotated: the lines before it, from agent.log.1, come first.
    (job_dir / "logs" / "host2" / "agent.log.1").write_text("agent 2 before\n")
    assert s.logs("5", host=2, job_dir=str(job_dir)) == "== host2 ==\nagent 2 before\nagent 2\n"


def test_logs_finds_the_job_dir_from_the_job_id(tmp_path, monkeypatch):
    job_dir = tmp_path / ".monarch" / "jobs" / "default"
    (job_dir / "logs").mkdir(parents=True)
    (job_dir / "slurm.json").write_text('{"job_id": "8"}')
    (job_dir / "logs" / "slurm-8.out").write_text("out\n")
    monkeypatch.chdir(tmp_path)
    assert SlurmScheduler().logs("8") == "== slurm-8.out ==\nout\n"
    assert SlurmScheduler().logs("9") == ""


# -- what a run is told about the time limit and the job's end -------------------------------------


def _record(tmp_path):
    from monarch_agents.keys import JobKeys
    from monarch._workbench.state import JobRecord

    keys = JobKeys("a" * 40, "b" * 40, "c" * 40, "d" * 40)
    return JobRecord("default", JobSpec("slurm", 2, 1, {}), "12", str(tmp_path / "j"), keys)


def test_reservation_end_names_the_time_limit(fake_slurm, tmp_path):
    from monarch._workbench.run import reservation_end

    rec = _record(tmp_path)
    fake_slurm("squeue", out="RUNNING|None|9:00|n[1-2]\n")
    assert reservation_end(rec) is None
    fake_slurm("squeue", out="TIMEOUT|TimeLimit|INVALID|n[1-2]\n")
    assert reservation_end(rec) == "hit its time limit"
    fake_slurm("squeue", out="CANCELLED|None|9:00|n[1-2]\n")
    assert reservation_end(rec) == "cancelled (scancel or admin)"
    fake_slurm("squeue", out="NODE_FAIL|NodeDown|9:00|n[1-2]\n")
    assert reservation_end(rec) == "a node failed (NodeDown)"
    # The controller not answering is no proof the job ended.
    fake_slurm("squeue", err="slurm_load_jobs error: Unable to contact slurm controller\n", rc=1)
    assert reservation_end(rec) is None


def test_reservation_end_waits_out_completing(fake_slurm, tmp_path):
    from monarch._workbench.run import reservation_end

    # COMPLETING twice, then the final state.
    counter = tmp_path / "n"
    counter.write_text("0\n")
    (tmp_path / "bin" / "squeue").write_text(f"""#!/bin/sh
read n < {counter}; n=$((n + 1)); echo $n > {counter}
if [ $n -le 2 ]; then echo 'COMPLETING|TimeLimit|INVALID|n1'; else echo 'TIMEOUT|TimeLimit|INVALID|n1'; fi
""")
    assert reservation_end(_record(tmp_path)) == "hit its time limit"
    assert counter.read_text() == "3\n"


def test_time_limit_warning_text(tmp_path):
    from monarch._workbench.run import format_duration, time_limit_warning

    rec = _record(tmp_path)
    assert time_limit_warning(rec, 252) == ("the reservation (slurm job 12) reaches its time limit in 4:12: "
                                            "this run is stopped then; `monarch serve` a longer --time for more")
    assert "past its time limit" in time_limit_warning(rec, 0)
    assert [format_duration(s) for s in (0, 59.9, 61, 3600, 90061)] == ["0:00", "0:59", "1:01", "1:00:00", "25:01:01"]


def test_time_warning_setting(monkeypatch):
    from monarch._workbench.reserve import time_warning_s

    monkeypatch.delenv("MONARCH_WARN_BEFORE", raising=False)
    assert time_warning_s() == 300.0
    assert time_warning_s(0.5) == 30.0
    monkeypatch.setenv("MONARCH_WARN_BEFORE", "10")
    assert time_warning_s() == 600.0 and time_warning_s(1) == 60.0
    monkeypatch.setenv("MONARCH_WARN_BEFORE", "soon")
    with pytest.raises(UsageError, match="MONARCH_WARN_BEFORE='soon' is not a number of minutes"):
        time_warning_s()
    with pytest.raises(UsageError, match="0 or more minutes"):
        time_warning_s(-1)


def test_watch_time_limit_warns_once_and_stops_with_the_run(fake_slurm, tmp_path):
    import threading

    from monarch._workbench.run import time_limit_warning, watch_time_limit

    rec = _record(tmp_path)
    got: list[str] = []
    done = threading.Event()
    done.set()  # a run that is already over is still warned: the first check always happens
    fake_slurm("squeue", out="RUNNING|None|4:00|n1\n")
    t = watch_time_limit(rec, done, 300, got.append)
    t.join(10)
    assert not t.is_alive() and got == [time_limit_warning(rec, 240)]
    got.clear()
    fake_slurm("squeue", out="RUNNING|None|1:00:00|n1\n")
    done = threading.Event()
    t = watch_time_limit(rec, done, 300, got.append)
    done.set()
    t.join(10)
    assert not t.is_alive() and got == []

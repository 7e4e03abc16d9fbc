"""PyTorch Monarch's verbs (apply, exec, kill, context, query forms) and the agent guide, end to end
on real local reservations, as a coding agent taught by Monarch's own guide would use them."""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest

from tests.cli.conftest import monarch

ACTOR_PROGRAM = """\
from monarch.actor import Actor, endpoint
from monarch.job import job_load


class Counter(Actor):
    def __init__(self, start: int):
        self.n = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n


procs = job_load().state().hosts.spawn_procs(per_host={"gpus": 1})
counters = procs.spawn("counters", Counter, 0)
for _ in range(3):
    counters.incr.call(1).get()
print("counted")
"""

JOB_MODULE = 'from monarch.job import ProcessJob\njob = ProcessJob({"hosts": 2})\nnot_a_job = 3\n'


@pytest.fixture
def jobdir(workdir):
    (workdir / "myjob.py").write_text(JOB_MODULE)
    return workdir


def test_monarch_agent_guide_sequence(jobdir):
    """Monarch's SKILL.md: apply a ProcessJob from a module, exec on one and all ranks, query, kill."""
    r = monarch("apply", "myjob.job", cwd=jobdir, check=True)
    assert re.fullmatch(r"Job is ready \(\d+s\)\n", r.stdout), r.stdout
    assert "applied reservation" in r.stderr

    r = monarch("apply", cwd=jobdir, check=True)  # the saved spec, the live reservation reused
    assert "reusing reservation" in r.stderr and r.stdout.startswith("Job is ready")

    r = monarch("profile", "--time", "100ms", "-o", "idle.json", cwd=jobdir)  # nothing runs: no telemetry to show
    assert r.returncode == 2 and "no telemetry in this window" in r.stderr and not (jobdir / "idle.json").exists()

    r = monarch("exec", "python", "-c", "print('one')", cwd=jobdir, check=True)
    assert r.stdout == "[host0] one\n"

    r = monarch("exec", "--all", "--", "sh", "-c", "echo r$MONARCH_HOST_RANK; exit $((MONARCH_HOST_RANK * 3))", cwd=jobdir)
    assert r.returncode == 3, r.stderr  # the highest of the ranks' codes; rank 1 was not stopped by rank 0
    assert sorted(r.stdout.splitlines()) == ["[host0] r0", "[host1] r1"]

    r = monarch("exec", "--point", "hosts=1", "-e", "K=v", "--", "sh", "-c", "echo $K", cwd=jobdir, check=True)
    assert r.stdout == "[host1] v\n"

    r = monarch("exec", "--all", "--per-host", "gpu=2", "--", "sh", "-c",
                "echo $MONARCH_RANK_HOSTS.$MONARCH_RANK_GPU/$MONARCH_SIZE_GPU", cwd=jobdir, check=True)
    assert sorted(line.split()[1] for line in r.stdout.splitlines()) == ["0.0/2", "0.1/2", "1.0/2", "1.1/2"]

    r = monarch("exec", "--script", "-", cwd=jobdir, input="echo from-script\nexit 4\n")
    assert r.returncode == 4 and r.stdout == "[host0] from-script\n"

    r = monarch("query", "SHOW TABLES", "--format", "json", cwd=jobdir, check=True)
    tables = {row["table_name"] for row in json.loads(r.stdout)["rows"]}
    assert {"runs", "procs"} <= tables
    r = monarch("query", "-", "--format", "jsonl", "--timeout", "30s", cwd=jobdir, check=True,
                input="SELECT count(*) AS n FROM runs")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["n"] >= 5  # one JSON object per line; the exec runs above are recorded

    # bad input: one line, exit 2, the reservation untouched
    for args, words in [
        (["exec", "--point", "hosts=2", "--", "true"], "outside mesh 'hosts'"),
        (["exec", "--per-host", "gpu=4,cpu=2", "--", "true"], "one dimension"),
        (["exec", "--all", "--one", "--", "true"], "exclude each other"),
        (["exec"], "no command specified"),
        (["query", "-f", "q.sql", "SELECT 1"], "not both"),
        (["query", "--timeout", "2x", "SELECT 1"], "duration"),
        (["apply", "nosuch_module.job"], "cannot import module 'nosuch_module'"),
        (["apply", "myjob.not_a_job"], "not a job object"),
        (["apply", "myjob.missing"], "has no attribute 'missing'"),
    ]:
        (jobdir / "q.sql").write_text("SELECT 1")
        r = monarch(*args, cwd=jobdir)
        assert r.returncode == 2 and words in r.stderr, (args, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr
    # a failed apply did not replace the saved spec
    assert (jobdir / ".monarch" / "specs" / "default").read_text() == "myjob.job"

    # the past: an actor program's endpoint calls are instants on the client's actor track
    (jobdir / "prog.py").write_text(ACTOR_PROGRAM)
    assert monarch("run", "prog.py", cwd=jobdir, check=True).stdout.strip() == "counted"
    monarch("profile", "--since", "10m", "-o", "past.json", cwd=jobdir, check=True)
    past = json.loads((jobdir / "past.json").read_text())["traceEvents"]
    calls = [e for e in past if e["ph"] == "i" and e["name"] == "call incr"]
    assert len(calls) == 3 and all(isinstance(e["ts"], int) for e in calls)
    assert any(e["ph"] == "X" and e["cat"] == "run" and e["name"].startswith("sh -c") for e in past)

    # a live window: a run in progress is a span per rank, clipped to the window
    monarch("run", "-d", "--", "sleep", "60", cwd=jobdir, check=True)
    r = monarch("--json", "profile", "--time", "500ms", "-o", "live.json", cwd=jobdir, check=True)
    assert json.loads(r.stdout)["hosts"] == 2
    events = json.loads((jobdir / "live.json").read_text())["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M"}
    hosts = {pid for pid, n in names if n in ("host0", "host1")}
    ranks = [e for e in events if e["ph"] == "X" and e["cat"] == "run" and e["name"] == "sleep 60"]
    assert len(hosts) == 2 and sorted(e["pid"] for e in ranks) == sorted(hosts)
    assert all(400_000 <= e["dur"] <= 60_000_000 for e in ranks)
    assert {n for _, n in names} >= {"rank 0", "rank 1"}

    r = monarch("kill", cwd=jobdir, check=True)
    assert r.stdout == "Killed context 'default'\n"
    r = monarch("exec", "--", "true", cwd=jobdir)
    assert r.returncode == 3
    r = monarch("kill", cwd=jobdir, check=True)  # safe to repeat
    assert "No job to kill" in r.stderr


def test_context_verbs_with_monarchs_messages(workdir):
    r = monarch("context", "ls", cwd=workdir, check=True)
    assert r.stdout == "No contexts.\n"
    r = monarch("context", "create", "exp2", cwd=workdir, check=True)
    assert r.stdout == "Created context 'exp2'\n"
    r = monarch("context", "use", "exp2", cwd=workdir, check=True)
    assert r.stdout == "Switched to context 'exp2'\n"
    rows = json.loads(monarch("--json", "context", "ls", cwd=workdir, check=True).stdout)
    assert [(x["name"], x["current"]) for x in rows] == [("exp2", True)]
    r = monarch("context", "rm", "exp2", cwd=workdir, check=True)
    assert r.stdout == "Removed context 'exp2'\n"
    rows = json.loads(monarch("--json", "context", "ls", cwd=workdir, check=True).stdout)
    assert [(x["name"], x["current"]) for x in rows] == [("default", True)]
    r = monarch("context", "use", "bad/name", cwd=workdir)
    assert r.returncode == 3 and "bad context name" in r.stderr


def _guide_commands(text: str) -> list[list[str]]:
    """Every `monarch ...` line of the guide's sh blocks, in order."""
    cmds, in_sh = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_sh = line.strip() == "```sh"
            continue
        if in_sh and line.startswith("monarch "):
            cmds.append(shlex.split(line)[1:])
    return cmds


def _guide_job_module(text: str) -> str:
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    return block


def test_every_command_of_the_agent_guide_runs(workdir):
    from monarch_cli.commands.guide import QUICK_START, guide_text

    text = guide_text()
    r = monarch("guide", cwd=workdir, check=True)
    assert r.stdout == text
    r = monarch("--help", cwd=workdir, check=True)
    assert "Quick start for agents" in r.stdout and "monarch kill" in r.stdout.split("Quick start for agents")[1]
    (workdir / "myjob.py").write_text(_guide_job_module(text))
    (workdir / "train.py").write_text("print('trained')\n")
    cmds = _guide_commands(text)
    assert cmds[0] == ["apply", "myjob.job"] and cmds[-1] == ["kill"] and len(cmds) >= 12
    # the quick start in --help: every line is a command the tool takes
    quick = [shlex.split(line.split("#")[0])[1:] for line in QUICK_START.splitlines() if line.strip().startswith("monarch ")]
    # the quick start runs on the guide's reservation (its apply reuses it), then releases it
    for args in cmds[:-1] + quick:
        r = monarch(*args, cwd=workdir, timeout=120)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    assert not os.path.exists(workdir / ".monarch" / "job_state.pkl")

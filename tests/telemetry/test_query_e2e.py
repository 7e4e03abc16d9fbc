"""End to end: real host agents record, `monarch query` fans out and merges, `why`, `stack`, `stop --save`.

One reservation of two local hosts serves the tests of this module (each test makes its own
run); the last test stops it with --save and queries the saved Parquet.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cli.conftest import MONARCH, ROOT, monarch

FAIL_RANK1 = ("import os, sys, time\n"
              "r = int(os.environ['NODE_RANK'])\n"
              "print(f'rank {r} starting', flush=True)\n"
              "if r == 1:\n"
              "    time.sleep(0.3)\n"
              "    raise ValueError('bad input 42')\n"
              "time.sleep(60)\n")


#: Each way a query is answered, by the environment of every command and of the agents serve starts.
MODES = {"client": {"MONARCH_FANOUT_DEGREE": "0"},  # every message straight from the client: its own engine
         "first-agent-tree": {"MONARCH_FANOUT_DIRECT_MAX": "1"}}  # the first agent asks the other through the tree


@pytest.fixture(scope="module", params=list(MODES))
def job(request, tmp_path_factory):
    """A reservation of two hosts; each test runs both ways: the query finished by the client, and
    by the first host agent (``query_on_agent``, the default), here asking the other host through
    the tree of host agents: the answers must be the same."""
    env = MODES[request.param]
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        d = tmp_path_factory.mktemp("telemetry-job")
        monarch("serve", "--hosts", "2", cwd=d, check=True)
        yield d
        monarch("stop", "--force", cwd=d, timeout=60)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def q(job, sql, *args, check=True, timeout=60):
    r = monarch("--json", "query", sql, *args, cwd=job, check=check, timeout=timeout)
    return json.loads(r.stdout) if check else r


def test_a_failed_run_is_explained_from_the_tables(job):
    r = monarch("run", "--", sys.executable, "-c", FAIL_RANK1, cwd=job, timeout=60)
    assert r.returncode == 1, r.stderr
    runs = q(job, "SELECT run_id, status, num_ranks, hosts, failed_ranks FROM runs ORDER BY started DESC LIMIT 1")
    assert runs["missing_hosts"] == []
    run = runs["rows"][0]
    assert (run["status"], run["num_ranks"], run["hosts"], run["failed_ranks"]) == ("failed", 2, "host0,host1", 2)
    exits = q(job, f"SELECT rank, host, exit_code, signal FROM rank_exits WHERE run_id = '{run['run_id']}' ORDER BY time")
    assert exits["rows"][0] == {"rank": 1, "host": "host1", "exit_code": 1, "signal": None}
    assert exits["rows"][1]["rank"] == 0 and exits["rows"][1]["signal"] == signal.SIGTERM
    # Rows from both hosts, merged: the lines each rank printed.
    logs = q(job, f"SELECT host, rank, stream, line FROM logs WHERE run_id = '{run['run_id']}' AND line LIKE 'rank %'")
    assert sorted((x["host"], x["line"]) for x in logs["rows"]) == [("host0", "rank 0 starting"), ("host1", "rank 1 starting")]
    why = json.loads(monarch("--json", "why", cwd=job, check=True).stdout)
    assert why["run_id"] == run["run_id"]
    assert (why["root"]["rank"], why["root"]["host"], why["root"]["exit_code"]) == (1, "host1", 1)
    assert why["root"]["exception"] == "ValueError: bad input 42"
    assert any("Traceback" in line for line in why["root"]["log_tail"])
    assert [(c["rank"], c["signal"]) for c in why["consequences"]] == [(0, signal.SIGTERM)]
    text = monarch("why", cwd=job, check=True).stdout
    assert "root failure: rank 1 on host1 exited with code 1" in text and "ValueError: bad input 42" in text


def test_output_formats(job):
    monarch("run", "--", "sh", "-c", "echo fmt-$NODE_RANK", cwd=job, check=True)
    sql = "SELECT host, line FROM logs WHERE line LIKE 'fmt-%' ORDER BY host"
    r = monarch("query", "--format", "csv", sql, cwd=job, check=True)
    assert list(csv.reader(io.StringIO(r.stdout))) == [["host", "line"], ["host0", "fmt-0"], ["host1", "fmt-1"]]
    r = monarch("query", "--format", "json", sql, cwd=job, check=True)
    assert json.loads(r.stdout) == {"rows": [{"host": "host0", "line": "fmt-0"}, {"host": "host1", "line": "fmt-1"}],
                                    "missing_hosts": []}
    r = monarch("query", sql, cwd=job, check=True)
    assert "fmt-0" in r.stdout and "fmt-1" in r.stdout and "2 rows" in r.stderr
    r = monarch("query", "SHOW TABLES", cwd=job, check=True)
    assert "rank_exits" in r.stdout and "message_status_events" in r.stdout
    r = monarch("--json", "query", "--tables", cwd=job, check=True)
    assert {t["table"] for t in json.loads(r.stdout)} >= {"actors", "meshes", "logs", "stacks", "runs", "hosts"}


def test_through_the_first_agent_the_client_imports_no_sql_engine(job):
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "monarch_cli.main", "--json", "query",
                        "SELECT host, count(*) AS n FROM hosts GROUP BY host ORDER BY host"], cwd=job, capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == [{"host": "host0", "n": 1}, {"host": "host1", "n": 1}]
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    through_agent = os.environ.get("MONARCH_FANOUT_DEGREE") != "0"
    assert ("datafusion" in imported) is not through_agent
    assert ("pyarrow" in imported) is not through_agent


def test_an_actor_program_fills_monarch_tables_and_job_query(job):
    script = job / "prog.py"
    script.write_text(
        "from monarch.actor import Actor, endpoint\n"
        "from monarch.job import job_load\n"
        "class W(Actor):\n"
        "    @endpoint\n"
        "    def step(self, x: int) -> int:\n"
        "        print('stepping', x, flush=True)\n"
        "        return x + 1\n"
        "procs = job_load().state().hosts.spawn_procs(per_host={'gpus': 2})\n"
        "w = procs.spawn('workers', W)\n"
        "for i in range(3):\n"
        "    w.step.call(i).get()\n"
        "w.slice(hosts=0, gpus=1).step.call_one(9).get()\n")
    monarch("run", str(script), cwd=job, check=True, timeout=120)
    rows = q(job, "SELECT m.endpoint, a.display_name, me.given_name, count(*) AS n FROM messages m "
                  "JOIN actors a ON m.to_actor_id = a.id JOIN meshes me ON a.mesh_id = me.id "
                  "WHERE me.given_name = 'workers' GROUP BY 1, 2, 3 ORDER BY 2")["rows"]
    assert [(r["display_name"], r["n"]) for r in rows] == [("workers[0]", 3), ("workers[1]", 4), ("workers[2]", 3),
                                                          ("workers[3]", 3)]
    statuses = q(job, "SELECT DISTINCT e.new_status FROM actor_status_events e JOIN actors a ON e.actor_id = a.id "
                      "WHERE a.display_name LIKE 'workers%'")["rows"]
    assert {"Created", "Initializing", "Idle"} <= {s["new_status"] for s in statuses}
    sent = q(job, "SELECT adverb, num_targets, count(*) AS n FROM sent_messages_ext s JOIN meshes me "
                  "ON s.actor_mesh_id = me.id WHERE me.given_name = 'workers' GROUP BY 1, 2 ORDER BY 1")["rows"]
    assert sent == [{"adverb": "call", "num_targets": 4, "n": 3}, {"adverb": "call_one", "num_targets": 1, "n": 1}]
    events = q(job, "SELECT e.status, count(*) AS n FROM message_status_events e JOIN messages m ON e.message_id = m.id "
                    "WHERE m.endpoint = 'step' GROUP BY e.status ORDER BY e.status")["rows"]
    assert events == [{"status": "active", "n": 13}, {"status": "complete", "n": 13}, {"status": "queued", "n": 13}]
    printed = q(job, "SELECT count(*) AS n FROM logs WHERE proc IS NOT NULL AND line LIKE 'stepping %'")["rows"]
    assert printed == [{"n": 13}]
    # The same from Python, on a loaded job.
    code = ("from monarch.job import job_load\n"
            "t = job_load().query(\"SELECT endpoint, count(*) AS n FROM messages WHERE endpoint = 'step' GROUP BY endpoint\")\n"
            "print(type(t).__name__, t.to_pylist(), t.schema.metadata[b'missing_hosts'].decode())\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=job, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.stdout.strip() == "Table [{'endpoint': 'step', 'n': 13}] []", r.stderr


def test_a_failed_actor_stops_then_fails_and_each_endpoint_is_one_port(job):
    script = job / "failing.py"
    script.write_text(
        "from monarch.actor import Actor, endpoint\n"
        "import monarch.actor\n"
        "from monarch.job import job_load\n"
        "monarch.actor.unhandled_fault_hook = lambda failure: None\n"
        "class F(Actor):\n"
        "    @endpoint\n"
        "    def ping(self) -> None:\n"
        "        pass\n"
        "    @endpoint\n"
        "    def pong(self) -> None:\n"
        "        pass\n"
        "    @endpoint\n"
        "    def fail(self) -> None:\n"
        "        raise RuntimeError('on purpose')\n"
        "f = job_load().state().hosts.spawn_procs(per_host={'gpus': 1}).spawn('failing', F)\n"
        "for _ in range(3):\n"
        "    f.ping.call().get()\n"
        "    f.pong.call().get()\n"
        "f.fail.broadcast()\n"
        "import time; time.sleep(1)\n")
    monarch("run", str(script), cwd=job, check=False, timeout=120)
    deadline = time.monotonic() + 30
    while True:
        rows = q(job, "SELECT a.display_name, e.new_status FROM actor_status_events e JOIN actors a "
                      "ON e.actor_id = a.id WHERE a.display_name LIKE 'failing%' "
                      "ORDER BY a.display_name, e.timestamp_us, e.id")["rows"]
        if sum(r["new_status"] == "Failed" for r in rows) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    for name in ("failing[0]", "failing[1]"):
        statuses = [r["new_status"] for r in rows if r["display_name"] == name]
        assert statuses == ["Created", "Initializing", "Idle", "Stopping", "Failed"], (name, rows)
    # As Monarch's port_index: the receiving actor's port, the same for every call of one endpoint.
    ports = q(job, "SELECT m.to_actor_id, m.endpoint, count(*) AS n, count(DISTINCT m.port_index) AS ports "
                   "FROM messages m JOIN actors a ON m.to_actor_id = a.id WHERE a.display_name LIKE 'failing%' "
                   "AND m.endpoint IN ('ping', 'pong') GROUP BY 1, 2")["rows"]
    assert sorted((r["n"], r["ports"]) for r in ports) == [(3, 1)] * 4
    per_actor = q(job, "SELECT count(DISTINCT m.port_index) AS ports FROM messages m JOIN actors a "
                       "ON m.to_actor_id = a.id WHERE a.display_name = 'failing[0]' "
                       "AND m.endpoint IN ('ping', 'pong')")["rows"]
    assert per_actor == [{"ports": 2}]


@pytest.mark.parametrize("sql,needle", [
    ("SELEC * FROM logs", "ParserError"),
    ("SELECT * FROM no_such_table", "no_such_table"),
    ("SELECT no_such_column FROM logs", "no_such_column"),
    ("INSERT INTO logs VALUES (1, 'h', NULL, NULL, NULL, 'stdout', 'x')", "not supported"),
])
def test_bad_sql_is_one_line_and_exit_2(job, sql, needle):
    r = monarch("query", sql, cwd=job)
    assert r.returncode == 2
    first, *rest = r.stderr.strip().splitlines()
    assert first.startswith("error:") and needle in first
    assert all(line.strip().startswith("hint:") for line in rest)


def test_huge_results_are_limited_unless_asked(job):
    monarch("run", "--", sys.executable, "-c", "print('\\n'.join('many %d' % i for i in range(30000)))", cwd=job,
            check=True, timeout=60)
    r = monarch("--json", "query", "SELECT line FROM logs WHERE line LIKE 'many %'", cwd=job, check=True)
    assert len(json.loads(r.stdout)["rows"]) == 1000
    assert "--no-limit" in r.stderr
    r = monarch("--json", "query", "--no-limit", "SELECT line FROM logs WHERE line LIKE 'many %'", cwd=job, check=True)
    assert len(json.loads(r.stdout)["rows"]) == 60000
    r = monarch("--json", "query", "--limit", "5", "SELECT count(*) AS n FROM logs WHERE line LIKE 'many %'", cwd=job,
                check=True)
    assert json.loads(r.stdout)["rows"] == [{"n": 60000}]


#: Slow by its own work, whatever the tables hold and whichever tests ran before: 3e9 generated rows
#: (a single generator, each row filtered; no statistic can answer the count) take seconds on any CPU,
#: so 0.5 s always runs out.  (A join of `logs` was slow only once earlier tests had written enough
#: lines: alone, `logs` is empty and the query answered 0 in time.)  Bounded, so the abandoned worker
#: thread (DataFusion cannot be interrupted) ends by itself.
SLOW_SQL = "SELECT count(*) AS n FROM generate_series(1, 3000000000) g WHERE g.value % 7 <> 3"


def test_a_slow_query_is_cancelled_and_the_agents_still_answer(job):
    r = monarch("query", "--timeout", "0.5", SLOW_SQL, cwd=job, timeout=60)
    assert r.returncode == 2 and "in time" in r.stderr
    assert q(job, "SELECT count(*) AS n FROM hosts")["rows"] == [{"n": 2}]


def test_stack_takes_live_python_stacks(job):
    prog = "import time\ndef waiting_here():\n    time.sleep(60)\nwaiting_here()\n"
    r = monarch("--json", "run", "--detach", "--", sys.executable, "-c", prog, cwd=job, check=True)
    run_id = json.loads(r.stdout)["run_id"]
    try:
        deadline = time.monotonic() + 30
        while True:
            r = monarch("--json", "stack", "--rank", "1", cwd=job, check=True)
            rows = json.loads(r.stdout)["rows"]
            if any(x["function"] == "waiting_here" for x in rows) or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert {x["rank"] for x in rows} == {1} and {x["host"] for x in rows} == {"host1"}
        assert any(x["function"] == "waiting_here" and x["run_id"] == run_id for x in rows), rows
        text = monarch("stack", "--host", "host0", cwd=job, check=True).stdout
        assert "waiting_here" in text and "host1" not in text
        kept = q(job, f"SELECT DISTINCT host FROM stacks WHERE run_id = '{run_id}' AND function = 'waiting_here' ORDER BY host")
        assert kept["rows"] == [{"host": "host0"}, {"host": "host1"}]
    finally:
        # The detached ranks, by the pids the procs table gives (nobody else's processes).
        pids = q(job, f"SELECT pid FROM procs WHERE run_id = '{run_id}' AND status = 'running'")["rows"]
        for row in pids:
            try:
                os.killpg(row["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_an_agent_killed_mid_query_gives_a_partial_answer_then_stop_save_and_query_from(job, tmp_path):
    monarch("run", "--", "sh", "-c", "echo kept-$NODE_RANK", cwd=job, check=True)
    state = json.loads(monarch("--json", "status", cwd=job, check=True).stdout)
    host1 = next(h for h in state["hosts"] if h["host"] == "host1")
    before = q(job, "SELECT host, count(*) AS n FROM logs GROUP BY host ORDER BY host")["rows"]
    saved = tmp_path / "saved"
    os.kill(host1["pid"], signal.SIGSTOP)  # hold it mid-query ...
    try:
        r = monarch("query", "--strict", "--timeout", "1", "SELECT count(*) FROM logs", cwd=job)
        assert r.returncode == 5 and "host1" in r.stderr
        p = subprocess.Popen([*MONARCH, "--json", "query", "--timeout", "20",
                              "SELECT host, count(*) AS n FROM logs GROUP BY host ORDER BY host"], cwd=job,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"})
        time.sleep(2.0)
        os.kill(host1["pid"], signal.SIGKILL)  # ... and kill it while the query waits for it
        out, err = p.communicate(timeout=30)
    finally:
        try:
            os.kill(host1["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert p.returncode == 0, err
    partial = json.loads(out)
    assert partial["missing_hosts"] == ["host1"]
    assert partial["rows"] == [r for r in before if r["host"] == "host0"]
    assert "host1 did not answer" in err
    # The rows survive the reservation: save them, stop, and ask the saved Parquet.
    r = monarch("stop", "--save", str(saved), cwd=job, check=True)
    assert (saved / "logs" / "host0.parquet").exists()
    again = json.loads(monarch("--json", "query", "--from", str(saved),
                               "SELECT host, count(*) AS n FROM logs GROUP BY host ORDER BY host", cwd=tmp_path,
                               check=True).stdout)
    assert again == {"rows": partial["rows"], "missing_hosts": []}
    why = json.loads(monarch("--json", "why", "--from", str(saved), cwd=tmp_path, check=True).stdout)
    assert why["run_id"] is not None
    r = monarch("query", "--from", str(tmp_path / "nothing-here"), "SELECT 1", cwd=tmp_path)
    assert r.returncode == 2 and "no saved telemetry" in r.stderr


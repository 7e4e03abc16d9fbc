"""Streams routed by port: two runs and a shell at once in one client process, each getting only its own bytes.

The client is a separate Python process (as a user's script would be), against a real
2-host local reservation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.cli.conftest import ROOT, monarch
from tests.helpers import wait_gone

pytestmark = pytest.mark.timeout(120)

CLIENT = textwrap.dedent("""
    import json, sys
    from monarch._workbench.run import RemoteRun
    from monarch._workbench.shell import RemoteShell
    from monarch._workbench.state import StatePaths, load_state

    record = load_state(StatePaths().resolve(None))
    hosts = sorted(record.hosts, key=lambda h: h.host_rank)
    out = {"a": {}, "b": {}}

    def collect(name):
        def on_output(rank, stream, data):
            key = f"{rank}.{stream}"
            out[name][key] = out[name].get(key, "") + data.decode()
        return on_output

    # Both runs print in turns with the other, so their streams are open at the same time.
    a = RemoteRun(record, hosts, ["sh", "-c", "for i in 1 2 3 4; do echo a$i; sleep 0.1; done"],
                  env={}, cwd=None, on_output=collect("a"))
    # Rank 1 fails well after rank 0 ended (a failing rank stops the others of its run).
    b = RemoteRun(record, hosts, ["sh", "-c", "for i in 1 2 3 4; do echo b$i; echo e$i >&2; sleep 0.1; done; "
                                              "if [ $NODE_RANK = 1 ]; then sleep 1; exit 3; fi"],
                  env={}, cwd=None, on_output=collect("b"))
    shell_out = []
    sh = RemoteShell(record, hosts[1], ["sh"], env={"PS1": ""}, on_output=lambda d: shell_out.append(d.decode()))
    a.start()
    sh.start()
    b.start()
    sh.send(b"sleep 0.2; echo shell-$((6*7)); exit 4\\n")
    ok = a.wait(60) and b.wait(60) and sh.wait(60)
    print(json.dumps({
        "ok": ok, "out": out, "shell": "".join(shell_out), "shell_exit": sh.exit_code,
        "a": [r.exit_code for r in a.outcome.results], "b": [r.exit_code for r in b.outcome.results],
    }))
""")


@pytest.fixture
def workdir(tmp_path):
    yield tmp_path
    monarch("stop", "--force", cwd=tmp_path, timeout=60)


def test_two_runs_and_a_shell_in_one_process(workdir):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    agents = [h["pid"] for h in json.loads(monarch("--json", "status", cwd=workdir, check=True).stdout)["hosts"]]
    r = subprocess.run([sys.executable, "-c", CLIENT], cwd=workdir, capture_output=True, text=True, timeout=90,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["ok"]
    for rank in (0, 1):
        assert res["out"]["a"][f"{rank}.stdout"] == "a1\na2\na3\na4\n"
        assert res["out"]["b"][f"{rank}.stdout"] == "b1\nb2\nb3\nb4\n"
        assert res["out"]["b"][f"{rank}.stderr"] == "e1\ne2\ne3\ne4\n"
    assert set(res["out"]["a"]) == {"0.stdout", "1.stdout"}
    assert res["a"] == [0, 0] and res["b"] == [0, 3]
    assert "shell-42" in res["shell"] and "a1" not in res["shell"] and "b1" not in res["shell"]
    assert res["shell_exit"] == 4
    monarch("stop", cwd=workdir, check=True)
    assert wait_gone(agents) == []

"""The one exit-status rule (monarch._workbench.exit_status, RunOutcome.exit_code), for every command
that passes a rank's end on: `monarch run`, `monarch exec`, submitit's launcher, `monarch logs`."""

from __future__ import annotations

import json
import signal

from monarch.errors import ExitCode
from monarch._workbench._submitit_task import exit_code as submitit_exit_code
from monarch._workbench.exit_status import exit_status, signal_of
from monarch._workbench.run import FailurePolicy, RankResult, RunOutcome
from tests.cli.conftest import monarch


def test_a_signal_is_128_plus_its_number():
    assert [exit_status(c) for c in (0, 3, -9, -15, None)] == [0, 3, 137, 143, 1]
    assert signal_of(137) is signal.SIGKILL and signal_of(-15) is signal.SIGTERM
    assert signal_of(1) is None and signal_of(128) is None and signal_of(0) is None


def _outcome(codes, policy, first=None, **kw) -> RunOutcome:
    results = [RankResult(i, f"host{i}", c) for i, c in enumerate(codes)]
    if first is None:
        first = next((i for i, c in enumerate(codes) if c != 0), None)
    return RunOutcome("r", results, first_failed=first, policy=policy, **kw)


def test_a_run_takes_its_first_failure_an_exec_its_highest_status():
    stop, indep = FailurePolicy.STOP_OTHERS, FailurePolicy.INDEPENDENT
    # `monarch run`: the first failed rank's status; the others ended by our SIGTERM are not news.
    assert _outcome([0, -9], stop).exit_code == 137
    assert _outcome([-15, 3], stop, first=1).exit_code == 3
    # `monarch exec`: each rank stands alone; a SIGKILLed rank beside ranks that exit 0 is 137, not max(0, -9).
    assert _outcome([0, -9, 0], indep).exit_code == 137
    assert _outcome([-9], indep).exit_code == 137
    assert _outcome([0, 3], indep).exit_code == 3
    assert _outcome([1, -9], indep).exit_code == 137
    assert _outcome([0, 0], indep).exit_code == 0
    assert _outcome([0, -9], indep, interrupted=True).exit_code == ExitCode.INTERRUPTED
    lost = _outcome([0, ExitCode.AGENT], indep)
    lost.results[1].agent_lost = True
    assert lost.exit_code == ExitCode.AGENT


def test_submitit_launcher_passes_a_killed_task_on_as_128_plus_signal():
    assert submitit_exit_code([0, -9]) == 137
    assert submitit_exit_code([0, 2, -9]) == 2
    assert submitit_exit_code([0, 0]) == 0


def test_exec_and_run_exit_statuses_end_to_end(workdir):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    kill_rank1 = "if [ $MONARCH_HOST_RANK = 1 ]; then kill -9 $$; fi; echo r$MONARCH_HOST_RANK"
    r = monarch("exec", "--all", "--", "sh", "-c", kill_rank1, cwd=workdir)
    assert r.returncode == 137, (r.returncode, r.stderr)
    assert "killed by SIGKILL" in r.stderr and r.stdout == "[host0] r0\n"
    r = monarch("exec", "--json", "--all", "--", "sh", "-c", kill_rank1, cwd=workdir)
    doc = json.loads(r.stdout)
    assert r.returncode == 137 and doc["exit_code"] == 137 and "killed by SIGKILL" in doc["error"]
    assert [rk["exit_code"] for rk in doc["ranks"]] == [0, -9]  # the ranks' own ends, as the agents report them
    r = monarch("exec", "--", "sh", "-c", "kill -TERM $$", cwd=workdir)
    assert r.returncode == 143, (r.returncode, r.stderr)  # not 241 (-15 as a byte)
    r = monarch("run", "--", "sh", "-c", kill_rank1, cwd=workdir)
    assert r.returncode == 137, (r.returncode, r.stderr)
    r = monarch("logs", "--list", cwd=workdir, check=True)
    assert r.stdout.count("exit 137") == 3, r.stdout


def test_run_refuses_a_host_named_twice(workdir):
    monarch("serve", "--hosts", "2", cwd=workdir, check=True)
    r = monarch("run", "--hosts", "0,0", "--", "echo", "once", cwd=workdir)
    assert r.returncode == ExitCode.USAGE and "host rank 0 is named twice" in r.stderr, r.stderr
    assert "once" not in r.stdout
    r = monarch("run", "--hosts", "1,0", "--", "sh", "-c", "echo $MONARCH_HOST_RANK", cwd=workdir, check=True)
    assert sorted(r.stdout.splitlines()) == ["[host0] 0", "[host1] 1"]

"""The lean `monarch run` (monarch_cli/lean.py) and the Click command say and exit alike.

Each case runs the same command line both ways against one real 2-host reservation: through
`monarch_cli.lean.lean_run` (which must take it, and never import Click), and through the Click
app (`monarch_cli.app.run_app`), which is what every command line went through before the lean
path.  Their stdout, stderr and exit codes must match.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from monarch_cli.lean import parse_run
from tests.cli.conftest import LEAN_DRIVER, ROOT, monarch

def _both(workdir, *argv: str):
    out = {}
    for way in ("lean", "click"):
        r, w = os.pipe()
        try:
            p = subprocess.run([sys.executable, "-c", LEAN_DRIVER, way, str(w), *argv], cwd=workdir,
                               capture_output=True, text=True, timeout=120, pass_fds=(w,),
                               env={**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"})
        finally:
            os.close(w)
        with os.fdopen(r) as f:
            info = json.loads(f.read())
        assert p.returncode == 0, p.stderr
        out[way] = (info, p.stdout, p.stderr)
    (lean, lean_out, lean_err), (click, click_out, click_err) = out["lean"], out["click"]
    assert lean["click"] is False, "the lean path imported Click"
    assert lean["code"] == click["code"]
    # Two hosts print in whichever order their lines arrive.
    assert sorted(lean_out.splitlines()) == sorted(click_out.splitlines())
    assert sorted(lean_err.splitlines()) == sorted(click_err.splitlines())
    return lean["code"], lean_out, lean_err


@pytest.fixture(scope="module")
def reserved(tmp_path_factory):
    d = tmp_path_factory.mktemp("lean")
    monarch("serve", "--hosts", "2", cwd=d, check=True)
    yield d
    monarch("stop", "--force", cwd=d, timeout=60)


def test_success_prints_every_rank_and_exits_0(reserved):
    code, out, err = _both(reserved, "run", "--", "sh", "-c", "echo out-$NODE_RANK; echo err-$NODE_RANK >&2")
    assert code == 0
    assert sorted(out.splitlines()) == ["[host0] out-0", "[host1] out-1"]
    assert sorted(err.splitlines()) == ["[host0] err-0", "[host1] err-1"]


def test_a_failed_rank_passes_its_exit_code_on(reserved):
    code, _, err = _both(reserved, "run", "--hosts", "1", "-e", "CODE=3", "--", "sh", "-c", "exit $CODE")
    assert code == 3
    assert "error: rank 0 on host1 exited with code 3" in err


def test_a_signalled_rank_is_128_plus_the_signal(reserved):
    code, _, err = _both(reserved, "run", "--hosts=0", "sh", "-c", "kill -TERM $$")
    assert code == 128 + 15
    assert "killed by SIGTERM" in err


def test_a_bad_reservation_name_is_one_error_line(reserved):
    code, out, err = _both(reserved, "run", "-n", "nope", "--", "true")
    assert code == 3 and out == ""
    assert err.splitlines()[0].startswith("error: no reservation 'nope' here")


def test_a_bad_env_option_is_worded_alike(reserved):
    code, _, err = _both(reserved, "run", "-e", "NOEQUALS", "--", "true")
    assert code == 2 and err.startswith("error: --env expects K=V, got 'NOEQUALS'")


@pytest.mark.parametrize("argv", [
    ["run"], ["run", "--"], ["run", "--help"], ["run", "-h"], ["--json", "run", "--", "true"],
    ["run", "--json", "--", "true"], ["run", "-v", "--", "true"], ["run", "--detach", "--", "true"],
    ["run", "--pdb", "--", "true"], ["run", "--rnak", "1", "--", "true"], ["run", "--name"],
    ["run", "--name", "", "--", "true"], ["run", "--name=", "true"], ["run", "-n", "a", "-n", "b", "true"],
    ["run", "-nfoo", "true"], ["run", "--warn-before", "1", "true"], ["status"], [],
])
def test_what_the_lean_path_leaves_to_click(argv):
    assert parse_run(argv) is None


def test_what_the_lean_path_takes():
    r = parse_run(["run", "-n", "a", "--hosts", "0,1", "-e", "A=1", "--env=B=2", "-w", "/tmp", "--", "x", "--json"])
    assert r is not None and (r.name, r.hosts, r.env, r.workdir, r.command) == \
        ("a", "0,1", ["A=1", "B=2"], "/tmp", ["x", "--json"])
    # The command's first word ends the options, as in Click (interspersed options are the command's).
    r = parse_run(["run", "python", "-c", "pass", "--name", "x"])
    assert r is not None and r.command == ["python", "-c", "pass", "--name", "x"] and r.name is None


def test_the_warning_lead_from_the_environment_goes_to_click(monkeypatch):
    # Click reads MONARCH_WARN_BEFORE for --warn-before and words a bad one its own way.
    monkeypatch.setenv("MONARCH_WARN_BEFORE", "x")
    assert parse_run(["run", "--", "true"]) is None

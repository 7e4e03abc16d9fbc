"""The lean `monarch sync` and `monarch query` (monarch_cli/lean.py) and the Click commands say and exit alike.

Each case runs the same command line both ways against one real 2-host reservation with a workspace:
through `monarch_cli.lean.lean_command` (which must take it, and never import Click), and through the
Click app (`monarch_cli.app.run_app`).  Their stdout, stderr and exit codes must match, and an edit
pushed the lean way is what every host's mount serves.  Through the warm runner too: the command's
own interpreter then imports none of the sync's or query's modules, and says the same.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from monarch_cli.lean import LeanQuery, LeanSync, parse, parse_query, parse_sync
from tests.cli.conftest import LEAN_DRIVER, MONARCH, ROOT, monarch

QUERY = "SELECT host, count(*) AS n, min(exit_code) AS lo FROM run_ranks GROUP BY host ORDER BY host"


def _one(workdir, way: str, *argv: str):
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
    return info, p.stdout, p.stderr


def _timeless(text: str) -> str:
    """A sync's line without what differs from one push to the next (how long it took, the generation)."""
    text = re.sub(r'"generation": "[0-9a-f]+"', '"generation": G', text)
    return re.sub(r" in \d+ ms", " in N ms", re.sub(r'"seconds": [0-9.e-]+', '"seconds": S', text))


def _both(workdir, *argv: str, before=None):
    """``argv`` the lean way and the Click way (``before()`` ahead of each): (code, stdout, stderr)."""
    out = {}
    for way in ("lean", "click"):
        if before is not None:
            before()
        out[way] = _one(workdir, way, *argv)
    (lean, lean_out, lean_err), (click, click_out, click_err) = out["lean"], out["click"]
    assert lean["click"] is False, "the lean path imported Click"
    assert lean["code"] == click["code"]
    assert _timeless(lean_out) == _timeless(click_out)
    assert _timeless(lean_err) == _timeless(click_err)
    return lean["code"], lean_out, lean_err


@pytest.fixture(scope="module")
def reserved(tmp_path_factory):
    d = tmp_path_factory.mktemp("leansq")
    ws = d / "ws"
    ws.mkdir()
    (ws / "f.py").write_text("x = 0\n")
    r = monarch("--json", "serve", "--hosts", "2", "--workspace", str(ws), cwd=d, check=True)
    MOUNTS.update(json.loads(r.stdout)["workspace"]["mounts"])
    # One run, so that run_ranks has a row per host to group.
    monarch("run", "--", "true", cwd=d, check=True)
    yield d
    monarch("stop", "--force", cwd=d, timeout=60)


#: Host -> where its agent serves the workspace (on this machine: readable here).
MOUNTS: dict[str, str] = {}


def _on_every_host(workdir, name: str) -> list[str]:
    """``[host] content`` of ``name`` in each host's mount, read there (not through `monarch run`,
    which would push the workspace itself first)."""
    assert set(MOUNTS) == {"host0", "host1"}
    out = []
    for host, mnt in sorted(MOUNTS.items()):
        with open(os.path.join(mnt, name)) as f:
            out.append(f"[{host}] {f.read().strip()}")
    return out


def test_an_edit_is_pushed_alike_and_every_host_serves_it(reserved):
    edits = iter(range(1, 100))
    last = []

    def edit():
        n = next(edits)
        last.append(n)
        with open(reserved / "ws" / "f.py", "w") as f:
            f.write(f"x = {n}\n")

    code, out, err = _both(reserved, "sync", before=edit)
    assert code == 0 and out == ""
    assert re.fullmatch(r"synced to 2 hosts: workspace: 1 files, 6 B, sent .* in N ms\n", _timeless(err)), err
    assert _on_every_host(reserved, "f.py") == [f"[host0] x = {last[-1]}", f"[host1] x = {last[-1]}"]
    # Nothing changed since: both say so.
    code, _, err = _both(reserved, "sync")
    assert code == 0 and err.endswith("unchanged\n"), err


def test_json_is_the_same_document(reserved):
    n = iter(range(100, 200))
    code, out, _ = _both(reserved, "sync", "--json",
                         before=lambda: (reserved / "ws" / "f.py").write_text(f"x = {next(n)}\n"))
    assert code == 0 and json.loads(out)[0]["changed"] is True


def test_a_reservation_without_a_workspace_is_one_error_line(workdir):
    # A folder of its own: a second reservation beside the module's would become the current one.
    monarch("serve", "--hosts", "1", cwd=workdir, check=True)
    code, out, err = _both(workdir, "sync")
    assert code == 2 and out == ""
    assert err.splitlines()[0] == "error: this reservation has no workspace to sync"


@pytest.mark.parametrize("argv", [["sync", "-n", "nope"], ["query", "-n", "nope", QUERY]])
def test_a_bad_reservation_name_is_one_error_line(reserved, argv):
    code, out, err = _both(reserved, *argv)
    assert code == 3 and out == ""
    assert err.splitlines()[0].startswith("error: no reservation 'nope' here")


@pytest.mark.parametrize("extra", [[], ["--format", "csv"], ["--format=json"], ["--json"], ["--format", "jsonl"],
                                   ["--limit", "1"], ["--no-limit"], ["--strict"]])
def test_a_query_answers_alike(reserved, extra):
    code, out, err = _both(reserved, "query", QUERY, *extra)
    assert code == 0
    if extra == ["--format", "csv"]:
        assert out.splitlines() == ["host,n,lo", "host0,1,0", "host1,1,0"]
    if extra == ["--limit", "1"]:
        assert "showing the first 1 rows" in err


def test_a_bad_query_is_one_error_line_alike(reserved):
    code, out, err = _both(reserved, "query", "SELECT nope FROM run_ranks")
    assert code != 0 and out == ""
    assert err.startswith("error: ") and "nope" in err.splitlines()[0]
    code, out, _ = _both(reserved, "query", "--json", "SELECT nope FROM run_ranks")
    assert json.loads(out)["exit_code"] == code


@pytest.mark.parametrize("argv", [
    ["sync", "--watch"], ["sync", "-w"], ["sync", "--workspace", "x"], ["sync", "--env-dir", "x"],
    ["sync", "--unreadable", "fail"], ["sync", "x"], ["sync", "--help"], ["sync", "-v"], ["sync", "--name"],
    ["sync", "-n", "a", "-n", "b"], ["sync", "--name="], ["sync", "--json=1"], ["--json", "sync"],
    ["query"], ["query", "-"], ["query", "--tables"], ["query", "-f", "q.sql"], ["query", "a", "b"],
    ["query", "  "], ["query", "x", "--format", "xml"], ["query", "x", "--limit", "0"],
    ["query", "x", "--limit", "-1"], ["query", "x", "--limit", "1e3"], ["query", "x", "--timeout", "5"],
    ["query", "x", "--from", "d"], ["query", "--", "x"], ["query", "x", "-v"], ["query", "x", "-h"],
    ["query", "x", "--limit", "1", "--limit", "2"], ["query", "x", "--no-limit=1"], ["status"], [],
])
def test_what_the_lean_path_leaves_to_click(argv):
    assert parse(argv) is None


def test_what_the_lean_path_takes():
    s = parse_sync(["sync", "-n", "a", "--json"])
    assert isinstance(s, LeanSync) and (s.name, s.json) == ("a", True)
    q = parse_query(["query", "--name=a", "SELECT 1", "--format", "csv", "--limit", "5", "--strict"])
    assert isinstance(q, LeanQuery)
    assert (q.sql, q.name, q.fmt, q.limit, q.no_limit, q.strict, q.json) == ("SELECT 1", "a", "csv", 5, False, True, False)


def test_the_timeout_from_the_environment_goes_to_click(monkeypatch):
    # Click reads MONARCH_QUERY_TIMEOUT for --timeout and words a bad one its own way.
    monkeypatch.setenv("MONARCH_QUERY_TIMEOUT", "x")
    assert parse(["query", "SELECT 1"]) is None


# -- through the warm runner -----------------------------------------------------------------


def _warm_env(on: bool) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1", "MONARCH_WARM_RUN": "1" if on else "0",
            "MONARCH_WARM_RUN_IDLE_S": "5"}


#: The modules a sync or query imports when it runs in the command's own process.
_HEAVY = ("monarch._workbench.workspace", "monarch._workbench.telemetry")


def _warm_ran(workdir, *argv: str, before=None):
    """``argv`` until the warm runner takes it: the command's interpreter (-X importtime) imported none of
    :data:`_HEAVY` then (the first command starts the runner and runs in-process).  ``before()`` ahead
    of each try."""
    deadline = time.monotonic() + 60
    while True:
        if before is not None:
            before()
        p = subprocess.run([sys.executable, "-X", "importtime", "-m", "monarch_cli.main", *argv], cwd=workdir,
                           capture_output=True, text=True, timeout=120, env=_warm_env(True))
        imports = [ln for ln in p.stderr.splitlines() if ln.startswith("import time:")]
        err = "".join(ln + "\n" for ln in p.stderr.splitlines() if not ln.startswith("import time:"))
        if not any(ln.rstrip().endswith(_HEAVY) for ln in imports):
            return p.returncode, p.stdout, err
        assert time.monotonic() < deadline, "no warm runner took the command"
        time.sleep(0.2)


def _cold(workdir, *argv: str):
    return subprocess.run([*MONARCH, *argv], cwd=workdir, capture_output=True, text=True, timeout=120,
                          env=_warm_env(False))


@pytest.mark.parametrize("argv", [["query", QUERY], ["query", "SELECT nope FROM run_ranks"], ["sync", "-n", "nope"]])
def test_warm_says_and_exits_as_in_process(reserved, argv):
    try:
        code, out, err = _warm_ran(reserved, *argv)
        cold = _cold(reserved, *argv)
        assert code == cold.returncode
        assert out == cold.stdout and err == cold.stderr
    finally:
        _stop_runners()


def test_a_warm_sync_is_served_everywhere(reserved):
    try:
        n = iter(range(1000))
        last = []

        def edit():
            last.append(next(n))
            (reserved / "ws" / "f.py").write_text(f"x = {last[-1]}\n")

        code, _, err = _warm_ran(reserved, "sync", before=edit)
        assert code == 0 and "sent" in err, err
        assert _on_every_host(reserved, "f.py") == [f"[host0] x = {last[-1]}", f"[host1] x = {last[-1]}"]
    finally:
        _stop_runners()


def _stop_runners() -> None:
    """This session's warm runners (idle, they would exit within a few seconds on their own)."""
    import psutil

    from tests.helpers import MARK, SESSION

    for p in psutil.process_iter(["pid"]):
        try:
            if "monarch_cli.warm" in " ".join(p.cmdline()) and p.environ().get(MARK) == SESSION:
                p.kill()
                p.wait(30)
        except (psutil.Error, OSError):
            continue


@pytest.mark.parametrize("sql, tables", [
    ("SELECT host, count(*) FROM run_ranks GROUP BY host", ["run_ranks"]),
    ('SELECT * FROM "LOGS" l JOIN run_ranks r ON l.run_id = r.run_id', ["run_ranks", "logs"]),
    ("SELECT * FROM runs", ["run_ranks"]),  # a view over run_ranks
    ("SELECT count(*) FROM procs", []), ("SHOW TABLES", []),
])
def test_a_query_reads_only_the_program_tables_it_names(sql, tables):
    from monarch._workbench.telemetry import _program_tables_named

    assert sorted(_program_tables_named(sql)) == sorted(tables)

"""The command line never surprises (issue #30): typos are usage errors that name the option,
--json is the one document wherever it is written, piped shells print only what ran.

One reservation (2 local hosts) serves the whole module; each test says what a newcomer saw.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cli.conftest import monarch


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    wd = tmp_path_factory.mktemp("surprises")
    monarch("serve", "--hosts", "2", cwd=wd, check=True)
    yield wd
    monarch("stop", "--force", cwd=wd, timeout=60)


def test_a_typod_option_is_a_usage_error_naming_the_closest(served):
    r = monarch("run", "--rnak", "1", "--", "true", cwd=served)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no such option: --rnak" in r.stderr and "did you mean --hosts?" in r.stderr
    assert "PATH" not in r.stderr
    r = monarch("run", "--hots", "1", "--", "true", cwd=served)
    assert r.returncode == 2 and "did you mean --hosts?" in r.stderr
    r = monarch("exec", "--pointt", "hosts=1", "--", "true", cwd=served)
    assert r.returncode == 2 and "did you mean --point?" in r.stderr
    # With --json the usage error is the document on stdout.
    r = monarch("run", "--json", "--detatch", "--", "true", cwd=served)
    assert r.returncode == 2 and "did you mean --detach?" in json.loads(r.stdout)["error"]
    # What follows `--`, or the command's first word, is the command's own: not checked.
    r = monarch("run", "--hosts", "1", "--", "sh", "-c", "echo $0", "--rnak", cwd=served)
    assert r.returncode == 0 and "[host1] --rnak" in r.stdout, r.stderr
    r = monarch("run", "-e", "A=1", "--hosts=0", "sh", "-c", "echo $A", cwd=served)
    assert r.returncode == 0 and "[host0] 1" in r.stdout, r.stderr


def test_a_missing_script_is_named_not_blamed_on_path(served):
    r = monarch("run", "nosuchfile.py", cwd=served)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "nosuchfile.py: no such file in" in r.stderr and "PATH" not in r.stderr
    r = monarch("--json", "run", "nosuchfile.py", cwd=served)
    assert json.loads(r.stdout)["exit_code"] == 2


@pytest.mark.parametrize("argv", [
    ["query", "--json", "SELEC 1"],
    ["why", "--json", "--name", "nope"],
    ["stack", "--json", "--name", "nope"],
    ["debug", "list", "--json", "--name", "nope"],
])
def test_json_after_the_subcommand_puts_errors_on_stdout(served, argv):
    r = monarch(*argv, cwd=served)
    assert r.returncode != 0
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == r.returncode and doc["error"]


def test_json_shell_prints_its_result(served):
    r = monarch("--json", "shell", "--host", "1", "sh", "-c", "echo on $MONARCH_HOST_RANK; exit 3", cwd=served,
                stdin=subprocess.DEVNULL)
    assert r.returncode == 3
    doc = json.loads(r.stdout)
    assert doc["host"] == 1 and doc["exit_code"] == 3 and doc["output"] == "on 1\n"


def test_a_piped_shell_prints_only_the_output(served):
    # As `echo ... | ssh host`: no echo of the input, no prompt, no bracketed-paste escapes, no \r.
    r = monarch("shell", "--host", "1", cwd=served, input="echo one $MONARCH_HOST_RANK\nsleep 1; exit 4\n")
    assert r.returncode == 4, r.stderr
    assert r.stdout == "one 1\n"
    r = monarch("shell", "--host", "0", "--", "wc", "-l", cwd=served, input="a\nb\n")
    assert r.returncode == 0 and r.stdout.split() == ["2"]


FAILING_ACTOR_PROGRAM = '''
from monarch.actor import Actor, endpoint
from monarch.job import job_load

class Bad(Actor):
    def __init__(self):
        raise ValueError("init blew up")

    @endpoint
    def f(self) -> int:
        return 1

procs = job_load().state().hosts.spawn_procs(per_host={"gpus": 1})
print(procs.spawn("bad", Bad).f.call().get())
'''


def test_why_after_a_failed_actor_program_blames_it_and_runs_list_it(served):
    assert monarch("run", "--", "sh", "-c", "exit 3", cwd=served).returncode == 3
    (served / "bad_actor.py").write_text(FAILING_ACTOR_PROGRAM)
    r = monarch("run", "bad_actor.py", cwd=served)
    assert r.returncode == 1, r.stdout + r.stderr
    runs = json.loads(monarch("--json", "logs", "--list", cwd=served, check=True).stdout)
    program_id = [x for x in runs if x["argv"] == ["bad_actor.py"]][-1]["run_id"]
    why = json.loads(monarch("--json", "why", cwd=served, check=True).stdout)
    assert why["run_id"] == program_id and why["argv"] == "bad_actor.py"
    assert why["root"]["kind"] == "actor" and "init blew up" in why["root"]["exception"]
    rows = json.loads(monarch("query", "--json", "SELECT run_id, hosts, status FROM runs ORDER BY started",
                              cwd=served, check=True).stdout)["rows"]
    assert rows[-1] == {"run_id": program_id, "hosts": "client", "status": "failed"}
    assert rows[-2]["hosts"] == "host0,host1" and rows[-2]["status"] == "failed"
    # The dashboard's Runs view is made of the same rows.
    from monarch_cli.tui.source import ReservationSource

    snap = ReservationSource(path=str(served / ".monarch" / "job_state.pkl")).poll()
    assert snap.runs and snap.runs[0].run_id == program_id and snap.runs[0].status == "failed", snap.banner
    assert [r["host"] for r in snap.runs[0].ranks] == ["client"]


def test_why_of_a_program_that_raised_here_shows_its_traceback(served):
    (served / "raises.py").write_text('print("working")\nraise RuntimeError("client side broke")\n')
    r = monarch("run", "raises.py", cwd=served)
    assert r.returncode == 1
    # As `python raises.py` shows it: from the program's frame, not monarch's runner or runpy.
    assert r.stderr.splitlines()[:2] == ["Traceback (most recent call last):",
                                         '  File "raises.py", line 2, in <module>'], r.stderr
    r = monarch("why", cwd=served, check=True)
    assert "(raises.py): failed" in r.stdout and "rank 0 on client exited with code 1" in r.stdout
    assert "exception: RuntimeError: client side broke" in r.stdout and "    working" in r.stdout
    assert "runpy" not in r.stdout
    assert monarch("run", "--", "true", cwd=served).returncode == 0
    r = monarch("why", cwd=served, check=True)
    assert "(true) succeeded: nothing failed" in r.stdout  # not "is succeeded"


def _without(tmp_path, *modules: str) -> dict:
    """An environment where ``modules`` cannot be imported, as when their extra is not installed."""
    shadow = tmp_path / "not-installed"
    for name in modules:
        (shadow / name).mkdir(parents=True, exist_ok=True)
        (shadow / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    from tests.cli.conftest import ROOT

    return {"PYTHONPATH": f"{shadow}:{ROOT}"}


def test_a_missing_optional_part_names_its_extra_and_the_install_command(tmp_path):
    env = _without(tmp_path, "yaml", "kubernetes", "submitit")
    r = monarch("serve", "--scheduler", "kubernetes", "--hosts", "1", "--image", "img", "--dry-run", cwd=tmp_path,
                env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the kubernetes scheduler needs the optional 'kubernetes' part" in r.stderr
    assert "pip install 'monarch-workbench[kubernetes]'" in r.stderr and "Traceback" not in r.stderr
    r = monarch("--json", "serve", "--scheduler", "kubernetes", "--hosts", "1", "--image", "img", cwd=tmp_path, env=env)
    assert "monarch-workbench[kubernetes]" in json.loads(r.stdout)["hint"]
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import monarch.job.submitit"], env={**__import__("os").environ, **env},
                       capture_output=True, text=True, timeout=60)
    assert "needs the optional 'slurm' part" in r.stderr and "pip install 'monarch-workbench[slurm]'" in r.stderr


def test_without_pyfuse3_the_fuse_fallback_says_how_to_install_it(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, **_without(tmp_path, "pyfuse3")}
    r = subprocess.run([sys.executable, "-c", "from monarch_rdmafs.mount import fuse_unavailable_reason as f; print(f())"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert "pyfuse3 is not installed" in r.stdout and "pip install 'monarch-workbench[fuse]'" in r.stdout, r.stderr


def test_status_puts_its_job_line_on_stdout_and_counts_in_words(served):
    r = monarch("status", cwd=served, check=True)
    first = r.stdout.splitlines()[0]
    assert first.startswith("job 'default' ") and "(2 hosts × 1 proc (local)): RUNNING" in first, r.stdout
    assert "job 'default'" not in r.stderr


def test_help_lists_whole_descriptions(tmp_path):
    r = monarch("--help", cwd=tmp_path, check=True)
    commands = r.stdout.split("Commands")[1].split("Exit codes")[0]
    import re

    assert not re.search(r"\w\.\.\.", commands), commands  # Click's cut: "reuses a..."
    assert "reuses a live" in commands and "reservation of the same shape." in commands


def test_serve_name_says_it_became_current(tmp_path):
    try:
        r = monarch("serve", "--name", "first", cwd=tmp_path, check=True)
        assert "now the current reservation" not in r.stderr  # nothing else was current
        r = monarch("serve", "--name", "big", cwd=tmp_path, check=True)
        assert "'big' is now the current reservation (was 'first'); `monarch context use first` switches back" \
            in r.stderr
        r = monarch("--json", "serve", "--name", "big", cwd=tmp_path, check=True)
        assert json.loads(r.stdout)["current"] is True and "previous_current" not in json.loads(r.stdout)
    finally:
        for name in ("big", "first"):
            monarch("stop", "--name", name, cwd=tmp_path, timeout=60)


def test_a_stopped_reservations_runs_stay_readable(tmp_path):
    try:
        monarch("serve", "--hosts", "2", cwd=tmp_path, check=True)
        (tmp_path / "prog.py").write_text('print("from the program")\n')
        assert monarch("run", "prog.py", cwd=tmp_path).returncode == 0
        r = monarch("run", "--", "sh", "-c", 'echo "line of $MONARCH_HOST_RANK"; sleep 0.5; '
                    'test $MONARCH_HOST_RANK = 1 && { echo "ValueError: broke on 1" >&2; exit 3; }; exit 0',
                    cwd=tmp_path)
        assert r.returncode == 3, r.stderr
    finally:
        monarch("stop", cwd=tmp_path, check=True)
    note = "reservation 'default'"
    r = monarch("--json", "logs", "--list", cwd=tmp_path, check=True)
    runs = json.loads(r.stdout)
    assert [x["kind"] for x in runs] == ["program", "command"] and runs[1]["exit_code"] == 3
    assert note in r.stderr and "was stopped at" in r.stderr and "read-only" in r.stderr
    r = monarch("logs", cwd=tmp_path, check=True)
    assert "[host0] line of 0" in r.stdout and "[host1] line of 1" in r.stdout and "ValueError: broke on 1" in r.stdout
    r = monarch("logs", "--run", runs[0]["run_id"], cwd=tmp_path, check=True)
    assert r.stdout == "from the program\n"
    r = monarch("--json", "why", cwd=tmp_path, check=True)
    why = json.loads(r.stdout)
    assert why["run_id"] == runs[1]["run_id"] and why["root"]["rank"] == 1 and why["root"]["exit_code"] == 3
    assert why["root"]["exception"] == "ValueError: broke on 1"
    r = monarch("query", "--json", "SELECT hosts, status FROM runs ORDER BY started", cwd=tmp_path, check=True)
    assert json.loads(r.stdout)["rows"] == [{"hosts": "client", "status": "succeeded"},
                                           {"hosts": "host0,host1", "status": "failed"}]
    # Read-only: nothing runs on it.
    r = monarch("run", "--", "true", cwd=tmp_path)
    assert r.returncode == 3 and "run `monarch serve` first" in r.stderr


def test_ranks_have_a_writable_output_dir_listed_fetched_and_named_by_the_read_only_hint(tmp_path):
    (tmp_path / "train.py").write_text('open("ckpt.pt", "w").write("x")\n')
    (tmp_path / "save.py").write_text('import os\nopen(os.path.join(os.environ["MONARCH_OUTPUT_DIR"], "result.txt"), '
                                      '"w").write("42")\n')
    try:
        monarch("serve", "--hosts", "2", "--workspace", ".", cwd=tmp_path, check=True)
        # Into the read-only workspace: the error's hint says where to write instead.
        r = monarch("run", "--", "python", "train.py", cwd=tmp_path)
        assert r.returncode == 1 and "Read-only file system" in r.stderr
        assert "hint: the workspace is read-only on the hosts: write checkpoints and results to $MONARCH_OUTPUT_DIR" \
            in r.stderr, r.stderr
        assert "$MONARCH_OUTPUT_DIR" in monarch("why", cwd=tmp_path, check=True).stdout
        r = monarch("run", "--", "sh", "-c", 'echo "ckpt of $MONARCH_HOST_RANK" > "$MONARCH_OUTPUT_DIR/model.pt"',
                    cwd=tmp_path, check=True)
        assert monarch("run", "save.py", cwd=tmp_path).returncode == 0
        runs = json.loads(monarch("--json", "logs", "--list", cwd=tmp_path, check=True).stdout)
        command, program = runs[-2], runs[-1]
        assert {h: o["files"] for h, o in command["output"].items()} == {"host0": 1, "host1": 1}
        assert program["output"]["client"]["files"] == 1
        assert f"--run {command['run_id']} --output DIR" in monarch("logs", "--list", cwd=tmp_path, check=True).stdout
        r = monarch("logs", "--run", command["run_id"], "--output", str(tmp_path / "back"), cwd=tmp_path, check=True)
        assert (tmp_path / "back" / "host1" / "model.pt").read_text() == "ckpt of 1\n"
        assert (tmp_path / "back" / "host0" / "model.pt").read_text() == "ckpt of 0\n"
        monarch("logs", "--output", str(tmp_path / "prog"), cwd=tmp_path, check=True)
        assert (tmp_path / "prog" / "client" / "result.txt").read_text() == "42"
    finally:
        monarch("stop", cwd=tmp_path, timeout=60)

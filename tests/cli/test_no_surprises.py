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

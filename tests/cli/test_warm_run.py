"""The warm runner (monarch_cli/warm.py): `monarch run` forked from a process that imported it already.

Against one real 2-host reservation, through the real `monarch` entry point with the runner on:
the same stdout, stderr and exit codes as the in-process run (success, a failed rank's code, 128+N,
a bad reservation name); the run really ran in the runner's child (the run lock names another
pid); Ctrl-C to the command stops the run (130); kill -9 of the command ends its child; idle, the
runner exits.  The test suite turns the runner off everywhere else (tests/helpers.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.cli.conftest import MONARCH, ROOT, monarch
from tests.helpers import MARK, SESSION

_IDLE_S = "3"


def _env(on: bool) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1", "MONARCH_WARM_RUN": "1" if on else "0",
            "MONARCH_WARM_RUN_IDLE_S": _IDLE_S}


def _runners() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if "monarch_cli.warm" in " ".join(p.cmdline()) and p.environ().get(MARK) == SESSION:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _run(workdir, *argv: str, on: bool = True):
    return subprocess.run([*MONARCH, "run", *argv], cwd=workdir, capture_output=True, text=True, timeout=120,
                          env=_env(on))


def _lock_pid(workdir) -> int:
    with open(workdir / ".monarch" / "jobs" / "default" / "run.lock") as f:
        return int(f.read().strip() or 0)


def _warm_ran(workdir, *argv: str):
    """Run until a runner takes it (the first command starts the runner and runs in-process)."""
    deadline = time.monotonic() + 60
    while True:
        p = subprocess.Popen([*MONARCH, "run", *argv], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=_env(True))
        out, err = p.communicate(timeout=120)
        if _lock_pid(workdir) != p.pid:
            return p.returncode, out, err
        assert time.monotonic() < deadline, "no warm runner took the run"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def reserved(tmp_path_factory):
    d = tmp_path_factory.mktemp("warm")
    monarch("serve", "--hosts", "2", cwd=d, check=True)
    yield d
    monarch("stop", "--force", cwd=d, timeout=60)
    for p in _runners():  # idle, they exit on their own within _IDLE_S; a failed test must not leave one
        p.kill()


@pytest.mark.parametrize("argv, code", [
    (["--", "sh", "-c", "echo out-$NODE_RANK; echo err-$NODE_RANK >&2"], 0),
    (["--hosts", "1", "-e", "CODE=3", "--", "sh", "-c", "exit $CODE"], 3),
    (["--hosts=0", "sh", "-c", "kill -TERM $$"], 143),
    (["-n", "nope", "--", "true"], 3),
])
def test_warm_says_and_exits_as_in_process(reserved, argv, code):
    got_code, out, err = _warm_ran(reserved, *argv)
    cold = _run(reserved, *argv, on=False)
    assert got_code == cold.returncode == code
    assert sorted(out.splitlines()) == sorted(cold.stdout.splitlines())
    assert sorted(err.splitlines()) == sorted(cold.stderr.splitlines())


def test_ctrl_c_stops_the_run(reserved):
    _warm_ran(reserved, "--", "true")
    p = subprocess.Popen([*MONARCH, "run", "--", "sleep", "60"], cwd=reserved, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_env(True))
    deadline = time.monotonic() + 30
    while _lock_pid(reserved) in (0, p.pid) or not psutil.pid_exists(_lock_pid(reserved)):
        assert time.monotonic() < deadline and p.poll() is None, "the warm run did not start"
        time.sleep(0.05)
    time.sleep(0.5)  # the ranks start
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert "interrupted" in err


def test_killing_the_command_ends_its_child(reserved):
    _warm_ran(reserved, "--", "true")
    p = subprocess.Popen([*MONARCH, "run", "--", "sleep", "60"], cwd=reserved, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=_env(True))
    deadline = time.monotonic() + 30
    while _lock_pid(reserved) in (0, p.pid) or not psutil.pid_exists(_lock_pid(reserved)):
        assert time.monotonic() < deadline and p.poll() is None, "the warm run did not start"
        time.sleep(0.05)
    child = psutil.Process(_lock_pid(reserved))
    p.kill()
    p.wait()
    child.wait(timeout=30)  # raises if it outlives its command
    assert _run(reserved, "--", "true", on=False).returncode == 0  # and the lock went with it


def test_an_idle_runner_exits(reserved):
    _warm_ran(reserved, "--", "true")
    assert _runners()
    deadline = time.monotonic() + float(_IDLE_S) + 30
    while _runners():
        assert time.monotonic() < deadline, "the runner did not exit once idle"
        time.sleep(0.2)


def test_the_suite_runs_without_it():
    assert os.environ.get("MONARCH_WARM_RUN") == "0"
    from monarch_cli.warm import enabled

    assert not enabled(["run", "--", "true"])


def test_what_it_takes(monkeypatch):
    from monarch_cli.warm import enabled

    monkeypatch.setenv("MONARCH_WARM_RUN", "1")
    assert enabled(["run", "-n", "x", "--", "true"])
    assert not enabled(["run", "train.py"])  # an actor program: Ctrl-C must reach it directly
    assert not enabled(["run", "--json", "--", "true"]) and not enabled(["status"])


def test_the_runner_forks_single_threaded():
    # fork() copies only the calling thread: whatever the runner preloads must start none.
    code = ("import importlib, threading, monarch_cli.warm as w\n"
            "for m in w.PRELOAD: importlib.import_module(m)\n"
            "print(threading.active_count())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.stdout.strip() == "1", r.stderr


def test_a_silent_connection_holds_no_one_up(reserved):
    _warm_ran(reserved, "--", "true")
    # Connected to the runner as `python -m monarch_cli.main` would be (same key), and then silent.
    code = ("import os, socket, sys, time\nsys.path[0] = os.getcwd()\n"
            "from monarch_cli.warm import _key, _socket_name\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\ns.connect(_socket_name(_key()))\n"
            "print('connected', flush=True)\ntime.sleep(60)\n")
    silent = subprocess.Popen([sys.executable, "-c", code], cwd=reserved, stdout=subprocess.PIPE, text=True,
                              env=_env(True))
    try:
        assert silent.stdout.readline().strip() == "connected"
        got_code, out, _ = _warm_ran(reserved, "--", "sh", "-c", "echo after")
        assert got_code == 0 and "after" in out
    finally:
        silent.kill()
        silent.wait()


def test_an_edited_file_retires_the_runner(tmp_path):
    from monarch_cli.warm import _code_files, _edited

    files = _code_files()
    assert any(f.endswith(os.path.join("monarch_cli", "warm.py")) for f in files)  # its own code is watched
    assert not _edited(files)
    f = tmp_path / "mod.py"
    f.write_text("x = 1\n")
    watched = {str(f): f.stat().st_mtime_ns}
    assert not _edited(watched)
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1_000_000))
    assert _edited(watched)
    f.unlink()
    assert _edited(watched)

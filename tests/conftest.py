"""Fixtures and the end-of-session leak check (helpers live in ``tests/helpers.py``).

Every process a test starts inherits ``MONARCH_TEST_SESSION`` (set by
``tests.helpers`` when it is imported, before anything is started), so what
*this* session left behind can be told apart from another session's processes.
At the end of the session none may be left: no host agent, no zygote, no proc,
no test script.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import sys
import tempfile

import pytest

from tests.helpers import kill_tree, session_pids, stop_client, wait_no_new_pids

# A suite started in the background of a script without job control (scripts/test.sh's `pytest &`)
# inherits SIGINT and SIGQUIT ignored, and so would every process it starts: each Ctrl-C test would
# then fail (a SIGINT does nothing).  The suite runs with the dispositions a terminal gives.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGQUIT) is signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture
def no_leaked_processes():
    """Fails the test if a process it started is still running ~5 s after it ended."""
    before = set(session_pids())
    yield
    left = wait_no_new_pids(before)
    if left:
        kill_tree(left)
        pytest.fail(f"test left processes running: {left}")


# Failures that reached this process's unhandled_fault_hook, oldest first (see _faults_are_recorded).
faults_heard: list = []


def _record_fault(failure) -> None:
    faults_heard.append(failure)
    print(f"monarch (test suite): unhandled failure recorded: {failure.report()}", file=sys.stderr, flush=True)


@pytest.fixture(scope="session", autouse=True)
def _faults_are_recorded():
    """The default ``unhandled_fault_hook`` ends the client, as Monarch's does: here the client is
    pytest, and a failure a test provokes (a killed proc, an actor that raises in a broadcast) would
    interrupt the whole session.  For the suite the hook records the failure and writes it on stderr
    instead; a test that checks failures sets its own (monkeypatch) or reads ``recorded_faults()``.
    The default itself is tested in a program of its own (tests/compat/default_fault_hook.py).  Left
    installed after the session: a failure arriving during the last stop must not interrupt it."""
    import monarch.actor

    monarch.actor.unhandled_fault_hook = _record_fault
    yield


@pytest.fixture
def recorded_faults():
    """The failures this test's client was told of and no hook of the test's own took."""
    first = len(faults_heard)
    return lambda: faults_heard[first:]


@pytest.fixture(scope="session", autouse=True)
def _third_party_temp_folders():
    """torchrun leaves a ``torchelastic_*`` folder in the temp dir for each run, and Chromium its
    ``org.chromium.Chromium.*``: their own behaviour, but this suite's folders, so they go with it."""
    patterns = [os.path.join(tempfile.gettempdir(), p) for p in ("torchelastic_*", "org.chromium.Chromium.*")]
    before = {d for p in patterns for d in glob.glob(p)}
    yield
    for d in {d for p in patterns for d in glob.glob(p)} - before:
        shutil.rmtree(d, ignore_errors=True)


# -- the session check --------------------------------------------------------------


def pytest_sessionfinish(session, exitstatus):
    try:
        stop_client()
    except Exception as e:  # pragma: no cover - reported below through the leftovers
        print(f"\nstopping the test client failed: {e}", file=sys.stderr)
    left = wait_no_new_pids(set())
    if left:
        kill_tree(left)
        lines = "\n".join(f"  {pid}: {cmd}" for pid, cmd in sorted(left.items()))
        print(f"\nERROR: the test session left {len(left)} process(es) running (now killed):\n{lines}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

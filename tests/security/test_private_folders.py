"""Private folders, attacked by a second local user (issue #24, findings 1, 2 and 7).

Each test makes the attacker's moves with the attacker's own account (``runuser``), then runs the
victim's real commands: the attack must get nothing (no file of the victim's in the attacker's
folder, nothing read), the victim gets one line naming the folder and the fix, and the victim's
reservation works once it is out of the way.
"""

from __future__ import annotations

import os
import stat
import sys

import pytest

from tests.cli.conftest import monarch

pytestmark = pytest.mark.timeout(300)


def _env(tmpdir: str) -> dict:
    # The victim's temp dir is the shared test folder (never the machine's /tmp); no XDG_RUNTIME_DIR,
    # as on a login node reached by a non-login shell or cron, so the guessable name is used.
    return {"TMPDIR": tmpdir, "XDG_RUNTIME_DIR": "", "MONARCH_WORKSPACE_DIR": ""}


def _victim_project(shared: str) -> str:
    proj = os.path.join(shared, "victim")
    os.mkdir(proj)
    os.chmod(proj, 0o755)  # others may look in, as in a usual home or project folder
    with open(os.path.join(proj, "x.py"), "w") as f:
        f.write("print('the victim code ran')\n")
    return proj


def _stop(proj: str, env: dict) -> None:
    monarch("stop", "--force", cwd=proj, env=env, timeout=60)


def test_a_temp_folder_made_first_by_another_user_gets_no_chunk_and_the_victim_is_told(attacker, shared):
    env = _env(shared)
    proj = _victim_project(shared)
    mine = os.path.join(shared, f"monarch-{os.getuid()}")
    # The attacker makes the victim's guessable per-user folder first, open to everyone.
    attacker.run(f"mkdir -m 777 {mine}")
    try:
        r = monarch("serve", "--workspace", ".", cwd=proj, env=env)
        assert r.returncode != 0, r.stdout
        assert f"{mine} belongs to another user (uid {attacker.uid})" in r.stderr, r.stderr
        # Nothing of the victim's landed in it.
        assert attacker.run(f"ls -A {mine}").stdout == ""
    finally:
        _stop(proj, env)
    # Once it is gone, the victim's own folder is made private and works.
    attacker.run(f"rm -rf {mine}")
    try:
        r = monarch("serve", "--workspace", ".", cwd=proj, env=env)
        assert r.returncode == 0, r.stderr
        st = os.lstat(mine)
        assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
        r = monarch("run", "--", sys.executable, "x.py", cwd=proj, env=env)
        assert r.returncode == 0 and "the victim code ran" in r.stdout, r.stderr
        # The attacker can neither list nor read the chunks.
        assert attacker.run(f"ls {mine}", check=False).returncode != 0
        assert attacker.run(f"find {mine} -type f -exec cat {{}} +", check=False).stdout == ""
    finally:
        _stop(proj, env)


def test_a_dot_monarch_of_another_user_above_the_project_is_never_used(attacker, shared):
    env = _env(shared)
    proj = _victim_project(shared)
    above = os.path.join(shared, ".monarch")
    # Another user's reservation folder above the victim's project: open to all, naming a context.
    attacker.run(f"mkdir -m 777 {above} && echo default > {above}/current && chmod 666 {above}/current")
    try:
        r = monarch("status", cwd=proj, env=env)
        assert r.returncode == 3, r.stderr
        assert f"{above} above was not used: belongs to another user (uid {attacker.uid})" in r.stderr, r.stderr
        assert "MONARCH_CEILING_DIRECTORIES" in r.stderr
        # serve makes the victim's own, private, and never writes above.
        r = monarch("serve", cwd=proj, env=env)
        assert r.returncode == 0, r.stderr
        assert sorted(attacker.run(f"ls -A {above}").stdout.split()) == ["current"]
        r = monarch("run", "--", "true", cwd=proj, env=env)
        assert r.returncode == 0, r.stderr
    finally:
        _stop(proj, env)


def test_every_folder_a_reservation_makes_is_0700_and_its_files_0600(attacker, shared):
    env = _env(shared)
    proj = _victim_project(shared)
    try:
        assert monarch("serve", "--workspace", ".", cwd=proj, env=env).returncode == 0
        r = monarch("run", "--", sys.executable, "x.py", cwd=proj, env=env)
        assert r.returncode == 0, r.stderr
        loose = []
        for top in (os.path.join(proj, ".monarch"), os.path.join(shared, f"monarch-{os.getuid()}")):
            for dirpath, dirnames, filenames in os.walk(top):
                if os.path.ismount(dirpath):
                    dirnames[:] = []  # a FUSE mount's files are the synced tree's own
                    continue
                mode = stat.S_IMODE(os.lstat(dirpath).st_mode)
                # The materialized tree keeps the project's own modes; its store folder is what counts.
                if mode != 0o700 and "/materialized/" not in dirpath + "/":
                    loose.append((dirpath, oct(mode)))
                for n in filenames:
                    p = os.path.join(dirpath, n)
                    st = os.lstat(p)
                    if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077 and "/materialized/" not in p:
                        loose.append((p, oct(stat.S_IMODE(st.st_mode))))
        assert loose == []
        # The attacker reads nothing: not the keys, not a log, not a listing.
        for what in ("ls .monarch", "cat .monarch/jobs/default/keys.json", "cat .monarch/jobs/default/logs/host0/agent.log",
                     "cat .monarch/job_state.pkl"):
            r = attacker.run(f"cd {proj} && {what}", check=False)
            assert r.returncode != 0 and "ermission denied" in r.stderr, (what, r.stdout)
    finally:
        _stop(proj, env)


def test_a_reservation_folder_writable_by_others_is_refused(shared, tmp_path):
    env = _env(shared)
    proj = _victim_project(shared)
    try:
        assert monarch("serve", cwd=proj, env=env).returncode == 0
        os.chmod(os.path.join(proj, ".monarch"), 0o777)  # a careless chmod, or someone else's doing
        r = monarch("run", "--", "true", cwd=proj, env=env)
        assert r.returncode == 3 and "is writable by others (mode 777)" in r.stderr, r.stderr
        os.chmod(os.path.join(proj, ".monarch"), 0o700)
        assert monarch("run", "--", "true", cwd=proj, env=env).returncode == 0
    finally:
        os.chmod(os.path.join(proj, ".monarch"), 0o700)
        _stop(proj, env)


def test_a_context_name_with_a_trailing_newline_is_refused(tmp_path):
    from monarch._workbench.state import StatePaths
    from monarch.errors import StateError

    with pytest.raises(StateError, match="bad context name"):
        StatePaths(str(tmp_path)).state_file("default\n")


def test_monarch_profiles_default_folder_made_first_by_another_user_is_refused(attacker):
    """``monarch.tools``' ``profile`` writes a job's traces to ``/tmp/$USER/monarch_profiles`` (as
    Monarch's): another user who made ``/tmp/$USER`` first gets nothing written in it."""
    import subprocess
    import uuid

    user = f"mnvictim{uuid.uuid4().hex[:8]}"
    top = f"/tmp/{user}"
    attacker.run(f"mkdir -m 777 {top}")
    code = "from monarch.tools.cli import _profiles_folder; print(_profiles_folder())"
    env = {**os.environ, "USER": user, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))}
    try:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and f"{top} belongs to another user (uid {attacker.uid})" in r.stderr, \
            r.stdout + r.stderr
        assert attacker.run(f"ls -A {top}").stdout == ""
        attacker.run(f"rm -rf {top}")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == f"{top}/monarch_profiles", r.stderr
        for d in (top, f"{top}/monarch_profiles"):
            st = os.lstat(d)
            assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700, (d, oct(st.st_mode))
    finally:
        subprocess.run(["rm", "-rf", top], capture_output=True)


EXEC_OUTPUT = """
import sys
from monarch.job import ProcessJob, exec_command
hosts = ProcessJob({"hosts": 1}).state(cached_path=None).hosts
print("rc=%d" % exec_command(hosts, ["echo", "the victim's secret"], output_dir=sys.argv[1] + "/$SUBDIR").get())
"""


def test_exec_command_output_folders_and_files_are_the_owners_only(attacker, shared, tmp_path):
    """``exec_command(..., output_dir=...)`` (``monarch exec --all`` writes to ``/tmp/monarch_exec_ID``): what
    the command printed is not readable by another user."""
    import subprocess

    out = os.path.join(shared, "out")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    env.pop("MONARCH_JOB", None)
    r = subprocess.run([sys.executable, "-c", EXEC_OUTPUT, out], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=180)
    assert r.stdout.strip() == "rc=0", r.stdout + r.stderr
    with open(os.path.join(out, "hosts_0", "stdout.txt")) as f:
        assert f.read() == "the victim's secret\n"
    r = attacker.run(f"cat {out}/hosts_0/stdout.txt", check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stdout + r.stderr
    for d in (out, f"{out}/hosts_0"):
        assert stat.S_IMODE(os.lstat(d).st_mode) == 0o700, d
    assert stat.S_IMODE(os.lstat(f"{out}/hosts_0/stdout.txt").st_mode) == 0o600


SUBMIT = """
import sys, submitit
ex = submitit.AutoExecutor(folder=sys.argv[1], cluster="monarch")
try:
    print("RESULT", ex.submit(pow, 2, 5).result())
except Exception as e:
    print("ERR", type(e).__name__, e)
"""


def test_a_submitit_folder_another_user_can_write_gets_no_pickle(attacker, shared, tmp_path):
    """submitit's folder holds the pickles both ends unpickle (the function on the hosts, the result
    here): one another user made, open to all, is refused in one line and gets nothing."""
    import subprocess

    pytest.importorskip("submitit")
    folder = os.path.join(shared, "logs")
    attacker.run(f"mkdir -m 777 {folder}")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}
    env.pop("MONARCH_JOB", None)
    r = monarch("serve", "--hosts", "1", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    try:
        r = subprocess.run([sys.executable, "-c", SUBMIT, folder], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=180)
        assert f"ERR UnsafeFolder {folder} belongs to another user (uid {attacker.uid})" in r.stdout, \
            r.stdout + r.stderr
        assert attacker.run(f"ls -A {folder}").stdout == ""
        # A folder of the user's own is made private, and used.
        mine = str(tmp_path / "mine")
        r = subprocess.run([sys.executable, "-c", SUBMIT, mine], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=180)
        assert "RESULT 32" in r.stdout, r.stdout + r.stderr
        assert stat.S_IMODE(os.lstat(mine).st_mode) == 0o700
    finally:
        monarch("stop", "--force", cwd=tmp_path, env=env, timeout=60)


def test_a_telemetry_collector_folder_made_first_by_another_user_is_not_used(attacker, shared, monkeypatch):
    """Monarch's TelemetryActor serves its socket under <tmp>/monarch-telemetry-<uid>/<job>: a guessable
    name another user may make first, open to all, to read the user's rows or feed them false ones."""
    import tempfile

    import monarch._src.job.telemetry_actor as ta

    monkeypatch.setattr(tempfile, "tempdir", shared)
    mine = os.path.dirname(ta.telemetry_socket_dir("job-1"))
    attacker.run(f"mkdir -m 777 {mine}")
    collector = ta.TelemetryActor("job-1", retention_secs=0)
    assert collector._activate_impl() is False  # refused, logged: no socket of the user's in it
    assert attacker.run(f"ls -A {mine}").stdout == ""
    # Once it is gone the user's own folders are made private, and the collector serves.
    attacker.run(f"rm -rf {mine}")
    try:
        assert collector._activate_impl() is True
        for d in (mine, ta.telemetry_socket_dir("job-1")):
            st = os.lstat(d)
            assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700, d
    finally:
        collector.close()

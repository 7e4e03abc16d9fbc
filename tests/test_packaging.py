"""The installed product: a wheel built with a plain ``pip wheel .`` holds every module and data file,
and installed into a fresh venv (no editable install, no script after it) it serves, runs, debugs and
stops."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
import zipfile

import pytest

from tests.helpers import ROOT

PARTS = ("monarch", "monarch_cli", "monarch_agents", "monarch_schedulers", "monarch_rdmafs", "monarch_telemetry")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    ROOT], check=True, capture_output=True, timeout=300)
    [name] = [n for n in os.listdir(out) if n.endswith(".whl")]
    return str(out / name)


def _tracked_sources() -> set[str]:
    """Every file of the parts that an install must carry: modules, the debug hook, styles, the guide."""
    files = subprocess.run(["git", "-C", ROOT, "ls-files", *PARTS], check=True, capture_output=True,
                           text=True).stdout.split()
    return {f for f in files if f.endswith((".py", ".tcss", ".md"))}


def test_the_wheel_holds_every_module_at_its_import_path(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    missing = sorted(_tracked_sources() - names)
    assert not missing, f"a non-editable install would lack: {missing}"
    assert "monarch_agents/_debughook/sitecustomize.py" in names  # breakpoint() in ranks needs it
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == set(PARTS)


def test_the_installed_names_are_ours():
    # Short top-level names (agents, schedulers) collide with other PyPI packages in users' environments.
    assert {p for p in PARTS if os.path.isfile(os.path.join(ROOT, p, "__init__.py"))} == set(PARTS)


def test_a_wheel_in_a_fresh_venv_serves_runs_debugs_and_stops(wheel, tmp_path):
    """A plain wheel install, used from a folder that is not the repository: serve, run, an actor
    program, breakpoint() + `monarch debug`, stop."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # No PYTHONPATH: the repository (with its egg-info) must not count as monarch already installed.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NO_COLOR"] = "1"
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel],
                   check=True, capture_output=True, timeout=300, env=env)
    # Dependencies come from the test venv, so the install needs no network: a path entry after the
    # venv's own site-packages (the .pth files there, our editable path among them, are not read).
    with open(os.path.join(site, "zz_test_deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "work"
    work.mkdir()
    mon = str(venv / "bin" / "monarch")

    def monarch(*args, check=True, **kw):
        r = subprocess.run([mon, *args], cwd=work, env=env, capture_output=True, text=True, timeout=120, **kw)
        assert not check or r.returncode == 0, f"monarch {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r

    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import monarch_agents; print(monarch_agents.__file__)"],
                           cwd=work, env=env, check=True, capture_output=True, text=True).stdout
    assert where.startswith(site), where  # the installed copy, not the repository
    try:
        monarch("serve", "--hosts", "2")
        out = monarch("run", "--", "python3", "-c", "import os; print('rank', os.environ['NODE_RANK'])").stdout
        assert sorted(line.split("] ")[1] for line in out.splitlines()) == ["rank 0", "rank 1"]
        (work / "actors.py").write_text(
            "from monarch.actor import Actor, endpoint, this_host\n"
            "class A(Actor):\n    @endpoint\n    def hi(self, x: int) -> int:\n        return x + 1\n"
            "procs = this_host().spawn_procs(per_host={'gpus': 2})\n"
            "print('actors', sorted(procs.spawn('a', A).hi.call(1).get().values()))\n")
        assert "actors [2, 2]" in monarch("run", "actors.py").stdout
        (work / "bp.py").write_text("x = 41\nbreakpoint()\nprint('after', x + 1, flush=True)\n")
        run = subprocess.Popen([mon, "run", "--hosts", "0", "--", "python3", "bp.py"], cwd=work, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            end = time.monotonic() + 60
            while time.monotonic() < end:
                if '"waiting": true' in monarch("debug", "list", "--json").stdout:
                    break
                time.sleep(0.2)
            else:
                raise AssertionError("the rank never stopped in breakpoint()")
            r = monarch("debug", input="attach 0\np x\ncontinue\nquit\n")
            assert "(Pdb) 41" in r.stdout, r.stdout + r.stderr
            out, err = run.communicate(timeout=60)
            assert run.returncode == 0 and "after 42" in out, out + err
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    finally:
        monarch("stop", check=False)

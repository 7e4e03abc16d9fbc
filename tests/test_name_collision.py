"""monarch works with another package called ``agents`` or ``schedulers`` first on sys.path.

``import agents`` is also the OpenAI Agents SDK, which many users have next to their
training code; our folders are installed as ``monarch_agents`` / ``monarch_schedulers``.
Here a package of each name that refuses to import is put first on PYTHONPATH, and
serve, run, an actor program, status and stop must all work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.cli.conftest import MONARCH, ROOT
from tests.helpers import wait_gone

pytestmark = pytest.mark.timeout(180)

ACTORS = textwrap.dedent("""
    from monarch.actor import Actor, endpoint, this_host

    class Echo(Actor):
        @endpoint
        def hi(self, x: int) -> int:
            return x + 1

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    print("actors", sorted(procs.spawn("echo", Echo).hi.call(41).get().values()))
""")


@pytest.fixture
def shadowed(tmp_path):
    """A PYTHONPATH whose first entry has packages ``agents`` and ``schedulers`` that raise on import."""
    shadow = tmp_path / "shadow"
    for name in ("agents", "schedulers"):
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text(f"raise ImportError('not monarch: a user package called {name}')\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), ROOT]), "NO_COLOR": "1"}
    yield work, env
    subprocess.run([*MONARCH, "stop", "--force"], cwd=work, env=env, capture_output=True, timeout=60)


def _monarch(work, env, *args, timeout=120):
    r = subprocess.run([*MONARCH, *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"monarch {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def test_serve_run_actors_with_other_agents_and_schedulers_packages_first(shadowed):
    work, env = shadowed
    for name in ("agents", "schedulers"):
        r = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=work, env=env, capture_output=True, text=True)
        assert f"a user package called {name}" in r.stderr  # the shadow is what `import NAME` finds
    _monarch(work, env, "serve", "--hosts", "2")
    out = _monarch(work, env, "run", "--", sys.executable, "-c", "import os; print('rank', os.environ['NODE_RANK'])").stdout
    assert sorted(line.split("] ")[1] for line in out.splitlines()) == ["rank 0", "rank 1"]
    (work / "actors.py").write_text(ACTORS)
    assert "actors [42, 42]" in _monarch(work, env, "run", "actors.py").stdout
    assert "actors [42, 42]" in subprocess.run([sys.executable, "actors.py"], cwd=work, env=env, capture_output=True,
                                               text=True, timeout=120).stdout
    _monarch(work, env, "status")
    pids = [h["pid"] for h in json.loads(_monarch(work, env, "--json", "status").stdout)["hosts"]]
    _monarch(work, env, "stop")
    assert wait_gone(pids) == []

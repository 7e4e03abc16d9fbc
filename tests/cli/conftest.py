import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MONARCH = [sys.executable, "-m", "monarch_cli.main"]


def monarch(*args, cwd, timeout=120, env=None, check=False, **kw):
    """Run the real `monarch` command in a subprocess."""
    e = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1", **(env or {})}
    r = subprocess.run([*MONARCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=e, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"monarch {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture
def workdir(tmp_path):
    """A working directory whose reservation (if any) is stopped at the end."""
    yield tmp_path
    monarch("stop", "--force", cwd=tmp_path, timeout=60)


#: Runs one command line one way (argv[1]: "lean", which monarch_cli.main tries first, or Click's app);
#: writes the exit code and whether Click was imported, as JSON,
#: to the descriptor argv[2].
LEAN_DRIVER = """
import json, os, sys
from monarch._workbench import command_process
command_process()
argv = sys.argv[3:]
if sys.argv[1] == "lean":
    from monarch_cli.lean import lean_command
    code = lean_command(argv)
else:
    from monarch_cli.app import run_app
    code = run_app(argv)
sys.stdout.flush(); sys.stderr.flush()
os.write(int(sys.argv[2]), json.dumps({"code": code, "click": "click" in sys.modules}).encode())
"""

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

"""Every `$ monarch ...` line of README's console blocks runs as written, or is named below with the
test that covers it instead (a cluster, an interactive session). A new README line that is neither
fails `test_every_readme_command_is_run_or_accounted_for`.

The user stands in the repository (examples/ is there) with the venv activated; placeholders
(DIR, `[--rank R]`) get real values; `monarch shell` gets its input piped. The blocks without
`monarch`: `scripts/install.sh && scripts/demo.sh` and `source .venv/bin/activate` run in
tests/examples/test_demo_and_examples.py (on a fresh clone), `scripts/test.sh` is this suite.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.helpers import ROOT

VENV_BIN = os.path.dirname(sys.executable)

#: Lines not run here, and what covers them.
ELSEWHERE = {
    "monarch serve --scheduler kubernetes": "a Kubernetes cluster: tests/schedulers/test_kubernetes.py (fake cluster)",
    "monarch debug": "an interactive pdb session: tests/cli/test_debug.py",
    "printf 'list\\nquit\\n' | monarch debug": "needs ranks paused in pdb: tests/cli/test_debug.py",
    "monarch run --pdb": "needs a failing train.py: tests/cli/test_debug.py (post-mortem)",
    "monarch dashboard": "an interactive terminal app: tests/tui/",
    "monarch serve --workspace . --env-dir .venv": "syncs a whole venv (GBs): tests/cli/test_workspace.py (--env-dir)",
}


def _blocks() -> list[list[str]]:
    text = open(os.path.join(ROOT, "README.md")).read()
    blocks = []
    for body in re.findall(r"```console\n(.*?)```", text, re.S):
        lines = []
        for raw in body.splitlines():
            if not raw.startswith("$ "):
                if lines and lines[-1].endswith("\\"):
                    lines[-1] = lines[-1][:-1] + " " + raw.strip()  # a continued line
                continue
            lines.append(raw[2:].strip())
        lines = [_strip_comment(line) for line in lines]
        if any("monarch" in line for line in lines):
            blocks.append(lines)
    return blocks


def _strip_comment(line: str) -> str:
    return line.split("  #", 1)[0].rstrip() if "  #" in line else line


def _elsewhere(line: str) -> str | None:
    return next((why for start, why in ELSEWHERE.items() if line.startswith(start)), None)


def _env(cwd) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MONARCH_JOB",)}
    env["PATH"] = os.pathsep.join([VENV_BIN, env.get("PATH", os.defpath)])  # `source .venv/bin/activate`
    env["NO_COLOR"] = "1"
    return env


def _as_shell(line: str, saved: str) -> str:
    line = re.sub(r"\s*\[--rank R\]", " --rank 0", line)
    line = re.sub(r"\s*\[--host H\]", " --host host0", line)
    line = line.replace(" DIR", f" {shlex.quote(saved)}")
    if line.startswith("monarch shell"):
        line = f"printf 'echo shell-ok $MONARCH_HOST_RANK\\nexit\\n' | {line}"
    return line


def test_every_readme_command_is_run_or_accounted_for():
    lines = [line for block in _blocks() for line in block]
    assert len(lines) > 20
    for line in lines:
        assert _elsewhere(line) or _runnable(line), f"README line neither run nor accounted for: {line}"


def _runnable(line: str) -> bool:
    return line.startswith("monarch ")


def _run_block(lines: list[str], cwd, saved: str) -> list[subprocess.CompletedProcess]:
    done = []
    for line in lines:
        if _elsewhere(line):
            continue
        cmd = _as_shell(line, saved)
        r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=_env(cwd), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"README `{line}` -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        done.append(r)
    return done


def _block_with(first: str) -> list[str]:
    return next(b for b in _blocks() if b and b[0].startswith(first))


@pytest.fixture
def repo_like(tmp_path):
    """A folder where `examples/...` resolves, as in the repository; its reservation stopped after."""
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    yield tmp_path
    subprocess.run(["bash", "-c", "monarch stop"], cwd=tmp_path, env=_env(tmp_path), capture_output=True, timeout=60)


def test_using_it(repo_like):
    block = _block_with("monarch serve --hosts 2 --procs-per-host 2")
    out = {line: r for line, r in zip([x for x in block if not _elsewhere(x)],
                                      _run_block(block, repo_like, str(repo_like / "saved")))}
    runs = [r for line, r in out.items() if "train_ddp.py" in line]
    assert all("[host0] final_loss" in r.stdout for r in runs)
    assert "13" in next(r for line, r in out.items() if "actors.py" in line).stdout.splitlines()
    assert (repo_like / "out.bin").exists()
    assert "shell-ok 1" in next(r for line, r in out.items() if line.startswith("monarch shell")).stdout


def test_workspace_sync(repo_like):
    (repo_like / "train.py").write_text('print("trained on the workspace")\n')
    block = _block_with("monarch serve --hosts 4 --workspace .")
    results = _run_block(block, repo_like, str(repo_like / "saved"))
    assert any("trained on the workspace" in r.stdout for r in results)


def test_telemetry_queries_why_stack_and_save(repo_like):
    subprocess.run(["bash", "-c", "monarch serve --hosts 2 && monarch run -- sh -c 'echo hi; exit 3'"],
                   cwd=repo_like, env=_env(repo_like), capture_output=True, timeout=300)
    block = _block_with('monarch query "SELECT host, count(*) FROM procs')
    saved = str(repo_like / "saved")
    results = _run_block(block, repo_like, saved)
    assert any("root failure: rank" in r.stdout for r in results)  # monarch why
    assert os.path.isdir(saved) and "sh -c" in results[-1].stdout  # the saved runs table, read after the stop

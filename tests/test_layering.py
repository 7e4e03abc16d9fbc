"""The layering, kept true: monarch_cli -> monarch -> agents; monarch -> schedulers; agents -> rdmafs, telemetry.

Every import in the source is read (top-level and inside functions, ``importlib.import_module``,
``__import__`` and ``sys.modules`` look-ups by name), so a lazy import cannot slip past.
"""

from __future__ import annotations

import ast
import os

import pytest

from tests.helpers import ROOT

#: Folder -> the installed top-level names its code may not import.
FORBIDDEN = {
    "agents": {"monarch", "monarch_cli", "monarch_schedulers"},
    "schedulers": {"monarch", "monarch_cli"},
    "rdmafs": {"monarch", "monarch_cli"},
    "telemetry": {"monarch", "monarch_cli"},
    "monarch": {"monarch_cli"},
    # The CLI talks to the monarch layer only (it builds no agent message itself).
    "monarch_cli": {"monarch_agents", "monarch_schedulers"},
}


def imported_names(source: str) -> list[tuple[int, str]]:
    """(line, module) for every module ``source`` imports or looks up by name."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            target = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
            by_name = name in ("import_module", "__import__") or (name in ("get", "pop") and target == "sys.modules")
            if by_name and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                out.append((node.lineno, key.value))
    return out


def _sources(folder: str):
    base = os.path.join(ROOT, folder)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_import_against_the_arrows(folder):
    bad = []
    for path in _sources(folder):
        with open(path) as f:
            for line, module in imported_names(f.read()):
                if module.split(".")[0] in FORBIDDEN[folder]:
                    bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {module}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_check_sees_every_kind_of_import():
    src = ("import monarch.job\nfrom monarch.errors import X\ndef f():\n    import monarch_cli.main\n"
           "importlib.import_module('monarch.actor')\nsys.modules.get('monarch.actor')\nsys.modules['monarch']\n"
           "from . import sibling\nlogging.getLogger('monarch.agents')\n")
    assert [m for _, m in imported_names(src)] == ["monarch.job", "monarch.errors", "monarch_cli.main",
                                                    "monarch.actor", "monarch.actor", "monarch"]

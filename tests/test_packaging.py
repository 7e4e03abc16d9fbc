"""The installed packages: every sub-package is listed in pyproject, so a non-editable install has it."""

from __future__ import annotations

import os
import tomllib

from tests.helpers import ROOT


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _installed_names() -> dict[str, str]:
    """Installed top-level package -> its folder in the repository."""
    setuptools = _pyproject()["tool"]["setuptools"]
    dirs = dict(setuptools.get("package-dir", {}))
    tops = {p.split(".")[0] for p in setuptools["packages"]}
    return {top: dirs.get(top, top) for top in tops}


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = set()
    for top, folder in _installed_names().items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, base)
                found.add(top if rel == "." else ".".join([top, *rel.split(os.sep)]))
    missing = sorted(found - listed)
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert not sorted(listed - found), "pyproject lists packages that have no folder with __init__.py"


def test_the_installed_names_are_ours():
    # Short top-level names (agents, schedulers) collide with other PyPI packages in users' environments.
    assert set(_installed_names()) == {"monarch", "monarch_cli", "monarch_agents", "monarch_schedulers",
                                       "monarch_rdmafs", "monarch_telemetry"}

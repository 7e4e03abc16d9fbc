"""PyTorch Monarch's ``Workspace``: the local project folders (and the Python environment) a job
submitted with ``monarch.tools.commands.create`` takes along.

    Workspace(dirs=["~/src/proj"])                 # ~/src/proj -> $WORKSPACE_DIR/proj on the hosts
    Workspace(dirs={"~/src/proj": "code/proj"})     # an explicit place under $WORKSPACE_DIR
    Workspace(dirs={"~/src/proj": ""})              # its contents at $WORKSPACE_DIR itself
    Workspace.null()                               # no folders, no environment

``env`` is the environment the folders run in (by default the active conda environment).  For
a reservation's hosts, ``monarch sync`` / ``job.remote_mount`` push a folder instead.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from monarch.tools.config.environment import CondaEnvironment, Environment

__all__ = ["ACTIVE_CONDA_ENV", "Workspace"]

#: The default ``env``: whatever conda environment is active when a job is created.
ACTIVE_CONDA_ENV = CondaEnvironment()

#: TorchX's macro for the root of a role's image (``torchx.specs.macros.img_root``), spelled out so
#: this module does not import TorchX.
_IMG_ROOT = "${img_root}"


class Workspace:
    """Local folders -> where each goes under the hosts' ``$WORKSPACE_DIR`` (``dirs``), and ``env``."""

    def __init__(self, dirs: list[Path | str] | dict[Path | str, str] | None = None,
                 env: Environment | None = ACTIVE_CONDA_ENV) -> None:
        self.env = env
        self.dirs: dict[Path, str] = {}
        if isinstance(dirs, dict):
            items = list(dirs.items())
        else:
            # A list: each folder goes under its own name.
            items = [(d, Path(d).name if d else "") for d in dirs or []]
        for src, dst in items:
            # An empty source would be the working directory, silently: refused (Monarch's AssertionError).
            assert src, f"{src!r} must not be empty: it would mean the working directory"
            self.dirs[Path(src)] = dst

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and (self.env, self.dirs) == (other.env, other.dirs)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return f"Workspace(dirs={self.dirs!r}, env={self.env!r})"

    def merge(self, outdir: str | Path) -> None:
        """Copy every folder into ``outdir`` at its destination (folders may share one: files merge)."""
        out = Path(outdir)
        out.mkdir(parents=True, exist_ok=True)
        for src, dst in self.dirs.items():
            shutil.copytree(src, out / dst, dirs_exist_ok=True)

    def set_env_vars(self, appdef: Any) -> None:
        """Tell each role of a TorchX ``AppDef`` where the workspace is, unless it says so already:
        ``WORKSPACE_DIR`` (default ``${img_root}/workspace``), each folder appended to ``PYTHONPATH``
        once, and ``CONDA_DIR`` (``${img_root}/conda``) when ``env`` is a conda environment."""
        for role in appdef.roles:
            root = role.env.setdefault("WORKSPACE_DIR", f"{_IMG_ROOT}/workspace")
            path = [p for p in role.env.get("PYTHONPATH", "").split(":") if p]
            path += [d for d in dict.fromkeys(f"{root}/{dst}" for dst in self.dirs.values()) if d not in path]
            role.env["PYTHONPATH"] = ":".join(path)
            if isinstance(self.env, CondaEnvironment):
                role.env.setdefault("CONDA_DIR", f"{_IMG_ROOT}/conda")

    @staticmethod
    def null() -> "Workspace":
        """No folders and no environment."""
        return Workspace(env=None)

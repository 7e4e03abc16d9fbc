"""Monarch's ``monarch.tools.utils``: its dot-directory (``MONARCH_HOME``) and the active conda
environment, as its launcher's configuration reads them."""

from __future__ import annotations

import os
import pathlib

__all__ = ["MONARCH_HOME", "conda"]


def MONARCH_HOME(*subdir_paths: str) -> pathlib.Path:  # noqa: N802 - Monarch's name
    """``$MONARCH_HOME`` (default ``~/.monarch``), or a folder under it, made if missing (0700: it
    holds a user's state on a shared machine)."""
    root = pathlib.Path(os.environ.get("MONARCH_HOME") or pathlib.Path.home() / ".monarch")
    path = root.joinpath(*subdir_paths)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


class conda:  # noqa: N801 - Monarch's name
    """The conda environment this process runs in (``CONDA_PREFIX``), if any."""

    @staticmethod
    def active_env_dir() -> str | None:
        """The active conda environment's folder, or None outside one."""
        return os.environ.get("CONDA_PREFIX")

    @staticmethod
    def active_env_name() -> str | None:
        """The active conda environment's name (its folder's), or None outside one."""
        prefix = conda.active_env_dir()
        return os.path.basename(prefix) if prefix else None

"""Monarch's ``monarch.tools.config.environment``: the Python environment a workspace names for its
job's hosts (a conda prefix, by default the active one)."""

from __future__ import annotations

from monarch.tools import utils

__all__ = ["CondaEnvironment", "Environment"]


class Environment:
    """What a workspace's projects need installed where they run."""


class CondaEnvironment(Environment):
    """A conda environment: ``conda_prefix`` as given, else the active one when asked."""

    def __init__(self, conda_prefix: str | None = None) -> None:
        self._conda_prefix = conda_prefix

    @property
    def conda_prefix(self) -> str:
        if self._conda_prefix:
            return self._conda_prefix
        active = utils.conda.active_env_dir()
        if not active:
            # an AssertionError, as Monarch's: programs may catch that type
            raise AssertionError("no conda environment is active: give a conda_prefix or activate one")
        return active

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CondaEnvironment) and self._conda_prefix == other._conda_prefix

    def __hash__(self) -> int:
        return hash(self._conda_prefix)

    def __repr__(self) -> str:
        return f"CondaEnvironment({self._conda_prefix!r})"

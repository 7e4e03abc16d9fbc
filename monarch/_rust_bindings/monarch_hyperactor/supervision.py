"""Compatibility only: Monarch's ``supervision`` names, aliases of monarch's."""

from monarch_agents.errors import MeshFailure, SupervisionError  # noqa: F401

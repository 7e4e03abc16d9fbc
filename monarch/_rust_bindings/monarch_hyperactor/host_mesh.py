"""Compatibility only: Monarch's ``host_mesh`` names: ``BootstrapCommand`` is monarch's
(``monarch.actor._bootstrap``), ``HostMesh`` its record of a host mesh (``HyHostMesh``)."""

from monarch.actor._bootstrap import BootstrapCommand  # noqa: F401
from monarch.actor._mesh import HyHostMesh as HostMesh  # noqa: F401

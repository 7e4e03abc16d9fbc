"""Compatibility only: the private module paths PyTorch Monarch's own examples import.

``monarch._src.actor.telemetry``, ``.actor_mesh``, ``.mock``, ``.host_mesh``, ``.proc_mesh`` and
``.endpoint`` give the same names as Monarch's, each an alias of monarch's public object (or, for
``mock.patch_actor``, of ``monarch.actor._mock``).  New code should import from ``monarch.actor``.
"""
